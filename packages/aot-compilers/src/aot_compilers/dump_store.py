"""Dump folders that survive concurrent writers and killed processes.

A *scope* is the set of dump folders one lock guards: the ``{folder_name}/{current_name}`` root of
a ``GraphDumper``, or the single folder of ``debug_compile``/``write_graph_folder``.

* **Lock.** ``.{scope}.aot_compilers.lock`` beside the scope's folder, taken with
  ``fcntl.flock(LOCK_EX)`` by every writer for the whole of a write (and by readers while they
  tidy and read). Without ``fcntl`` (not Linux/macOS) writes go on unlocked, with a warning.
  The lock file is never removed (removing lock files races with their next user).
* **Write.** A folder is filled under a hidden name ``.{final}.{pid}.{token}.tmp`` in the same
  directory; its manifest ``.aot_compilers_dump`` (JSON: run id, kind, index, every file with its
  size) is written last; then the folder is swapped into place. On Linux the swap is
  ``renameat2(RENAME_EXCHANGE)``: the final path holds the old dump, then the new one, and never
  stops existing. Elsewhere (or on file systems without it) the old folder is renamed to
  ``.{final}.{pid}.{token}.old`` and the new one into place.
* **Tidy.** Under the lock, before every write and read: an ``.old`` folder whose final folder is
  missing (its writer died between the two renames) is put back; other ``.old``, ``.tmp`` and
  ``.trash`` leftovers are removed. While the lock works every writer holds it as long as its
  temporaries exist, so whatever a lock holder finds is a dead writer's; without working locks
  only leftovers whose process is gone (same host) or older than ``STALE_AFTER_S`` are touched.
  Only the scope's directory is listed, never the dump folders inside it, so a write costs one
  directory listing however many graphs were dumped.
* **Late files.** A file added after the folder is in place (the example inputs, saved on a
  graph's first run) and the manifest listing it are written as ``.{final}.{pid}.{token}.tmp``
  files beside the folder (where tidying finds them) and renamed into it, under the lock.

``_step_hook`` (tests only) is called with the name of each step, so a test can kill the writer at
every point of the protocol.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import GraphDumpError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MARKER = ".aot_compilers_dump"
FORMAT = "aot_compilers.dump/1"
STALE_AFTER_S = 3600.0  # leftovers are this old before they count as dead without a lock

_step_hook: Callable[[str], None] | None = None
_use_exchange = True  # tests turn it off to exercise the two-rename swap
_warned_unlocked = False


def _step(name: str) -> None:
    hook = _step_hook
    if hook is not None:
        hook(name)


def new_run_id() -> str:
    return uuid.uuid4().hex


def _token() -> str:
    return secrets.token_hex(4)


# -- locking -------------------------------------------------------------------------------
def _warn_unlocked(lock_file: Path, why: str) -> None:
    global _warned_unlocked
    if not _warned_unlocked:
        _warned_unlocked = True
        log.warning("graph dumps under %s are written without a lock (%s): concurrent writers "
                    "into one dump folder are not serialized", lock_file.parent, why)


@contextlib.contextmanager
def _flock(lock_file: Path, *, required: bool) -> Iterator[bool]:
    """Hold an exclusive lock on ``lock_file``; yields whether a real lock is held.

    The lock file is opened without following a link (``O_NOFOLLOW``) and must be a regular
    file: a link planted there would make the lock create or lock a file outside the dump
    folder, so a link (or a FIFO, a device) there is a GraphDumpError, for readers too.
    """
    if os.path.islink(lock_file):
        raise GraphDumpError(_not_a_lock(lock_file, "a symbolic link"))
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(lock_file, flags, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:  # became a link since the check above
            raise GraphDumpError(_not_a_lock(lock_file, "a symbolic link")) from None
        if required:
            raise GraphDumpError(f"cannot create the dump lock {lock_file}: {error}") from error
        fd = None
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GraphDumpError(_not_a_lock(lock_file, "not a regular file"))
    if fd is None:
        yield False  # a reader of a read-only or missing dump: read without the lock
        return
    try:
        locked = False
        if fcntl is None:
            _warn_unlocked(lock_file, "no fcntl on this platform")
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                locked = True
            except OSError as error:  # e.g. ENOLCK on a file system without locks
                _warn_unlocked(lock_file, str(error))
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _not_a_lock(lock_file: Path, what: str) -> str:
    return (f"the dump lock {lock_file} is {what}; refusing to use it (a lock must be a regular "
            "file beside the dump folder): remove it and dump again")


def make_root(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GraphDumpError(f"cannot create dump folder {root}: {error}") from error


@dataclass(frozen=True)
class DumpScope:
    """The dump folders in ``root`` whose names match ``final_pattern``, guarded by one lock."""

    root: Path
    lock_file: Path
    final_pattern: str

    @classmethod
    def for_dumper(cls, root: Path, name: str) -> DumpScope:
        return cls(root, root.parent / f".{root.name}.aot_compilers.lock",
                   rf"{re.escape(name)}_(?:forward|backward|joint)_\d+")

    @classmethod
    def for_folder(cls, final: Path) -> DumpScope:
        return cls(final.parent, final.parent / f".{final.name}.aot_compilers.lock",
                   re.escape(final.name))

    def leftover_re(self) -> re.Pattern[str]:
        return re.compile(rf"^\.(?P<final>{self.final_pattern})\.(?:(?P<pid>\d+)\.)?"
                          rf"[A-Za-z0-9_]+\.(?P<what>tmp|old|trash)$")

    def final_re(self) -> re.Pattern[str]:
        return re.compile(rf"^(?:{self.final_pattern})$")

    @contextlib.contextmanager
    def locked(self, *, for_reading: bool = False) -> Iterator[bool]:
        """Hold the scope's lock and tidy leftovers first; yields whether a real lock is held.

        Writers create the root; readers of a missing or read-only root go on without a lock.
        """
        if not for_reading:
            make_root(self.root)
        with _flock(self.lock_file, required=not for_reading) as locked:
            tidy(self, locked)
            yield locked


# -- tidying leftovers ---------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    if os.name != "posix" or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _is_stale(path: Path, pid: str | None, locked: bool) -> bool:
    if locked:
        return True
    if pid is not None and not _pid_alive(int(pid)):
        return True
    try:
        return time.time() - path.lstat().st_mtime > STALE_AFTER_S
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _settle(entry: Path, final: Path, what: str) -> None:
    if what == "old" and not final.exists():
        # A writer died between moving the old dump aside and moving the new one in: the old
        # dump goes back. (``entry/final.name``: the nested layout of aot_compilers 0.1.)
        for candidate in (entry, entry / final.name):
            if (candidate / MARKER).is_file():
                try:
                    os.rename(candidate, final)
                except OSError as error:
                    log.warning("cannot restore %s from %s: %s", final, candidate, error)
                    return
                log.warning("restored graph dump %s from %s, left by a writer that died while "
                            "replacing it", final, candidate)
                break
    if entry.exists() or entry.is_symlink():
        log.info("removing %s, left by a graph dump writer that died", entry)
        _remove(entry)


def tidy(scope: DumpScope, locked: bool) -> None:
    """Recover orphaned ``.old`` dumps and remove dead writers' leftovers in ``scope``."""
    try:
        entries = list(scope.root.iterdir())
    except OSError:
        return
    leftover = scope.leftover_re()
    for entry in entries:
        match = leftover.match(entry.name)
        if match and _is_stale(entry, match["pid"], locked):
            _settle(entry, scope.root / match["final"], match["what"])


# -- manifests -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DumpManifest:
    """What a dump folder's ``.aot_compilers_dump`` manifest says.

    ``run_id`` groups the folders of one compile (one ``GraphDumper`` call: joint, forward,
    backward); it is ``None`` for a folder written by aot_compilers 0.1 (an empty marker).
    ``files`` maps each file (relative path) to its size in bytes; ``pending`` names files the
    writer meant to add later (the example inputs, saved on a graph's first run) and has not.
    """

    folder: Path
    run_id: str | None
    kind: str | None = None
    index: int | None = None
    group: str | None = None
    pid: int | None = None
    host: str | None = None
    created: float | None = None
    files: Mapping[str, int] = field(default_factory=dict)
    pending: tuple[str, ...] = ()


def _bad_manifest(marker: Path, why: str) -> GraphDumpError:
    return GraphDumpError(f"{marker} is not a valid dump manifest: {why} (expected JSON with "
                          f"format {FORMAT!r}, a string run_id and files mapping relative paths "
                          f"to sizes)")


def _safe_relative(name: Any) -> bool:
    if not isinstance(name, str) or not name:
        return False
    parts = PurePosixPath(name).parts
    return not PurePosixPath(name).is_absolute() and ".." not in parts and "\\" not in name


def _load_manifest_data(folder: Path) -> dict[str, Any] | None:
    """The manifest's JSON (``None`` for an empty 0.1 marker); raises if missing or invalid."""
    marker = folder / MARKER
    try:
        text = marker.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphDumpError(f"{folder} is not a complete graph dump: it has no {MARKER} "
                             f"manifest (the manifest is written last, after every other "
                             f"file)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise GraphDumpError(f"cannot read the dump manifest {marker}: {error}") from error
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise _bad_manifest(marker, str(error)) from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _bad_manifest(marker, "unknown format")
    files, pending = data.get("files"), data.get("pending", [])
    if not isinstance(data.get("run_id"), str) or not isinstance(files, dict):
        raise _bad_manifest(marker, "run_id or files missing")
    if not all(_safe_relative(k) and type(v) is int and v >= 0 for k, v in files.items()):
        raise _bad_manifest(marker, "files must map relative paths inside the folder to sizes")
    if not isinstance(pending, list) or not all(_safe_relative(p) for p in pending):
        raise _bad_manifest(marker, "pending must be a list of relative paths")
    return data


def _manifest(folder: Path, data: dict[str, Any] | None) -> DumpManifest:
    if data is None:
        return DumpManifest(folder=folder, run_id=None)

    def opt(key: str, kind: type | tuple[type, ...]) -> Any:
        value = data.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    return DumpManifest(folder=folder, run_id=data["run_id"], kind=opt("kind", str),
                        index=opt("index", int), group=opt("group", str), pid=opt("pid", int),
                        host=opt("host", str), created=opt("created", (int, float)),
                        files=dict(data["files"]), pending=tuple(data.get("pending", ())))


def read_manifest(folder: str | os.PathLike[str], *, verify: bool = True) -> DumpManifest:
    """The manifest of dump folder ``folder``.

    Raises ``GraphDumpError`` when the folder has no manifest (not a dump, or not complete), the
    manifest is invalid, or (with ``verify``) a file it lists is missing or has another size.
    """
    folder = Path(folder)
    manifest = _manifest(folder, _load_manifest_data(folder))
    if verify:
        for name, size in manifest.files.items():
            try:
                actual = (folder / name).stat().st_size
            except OSError:
                raise GraphDumpError(f"graph dump {folder} is incomplete: {name}, listed in its "
                                     f"manifest, is missing") from None
            if actual != size:
                raise GraphDumpError(f"graph dump {folder} is inconsistent: {name} has {actual} "
                                     f"bytes, its manifest says {size}")
    return manifest


def is_dump(folder: Path) -> bool:
    return folder.is_dir() and (folder / MARKER).is_file()


def _listed_files(folder: Path) -> dict[str, int]:
    files: dict[str, int] = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if rel == MARKER:
                continue
            files[rel] = path.stat().st_size
    return dict(sorted(files.items()))


def _beside(folder: Path) -> Path:
    """A temporary file name beside ``folder``, where tidying finds it if its writer dies."""
    return folder.parent / f".{folder.name}.{os.getpid()}.{_token()}.tmp"


def _manifest_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _replace_manifest(folder: Path, data: dict[str, Any]) -> None:
    """Atomically (temporary file beside the folder, then rename) rewrite its manifest."""
    tmp = _beside(folder)
    try:
        tmp.write_text(_manifest_text(data), encoding="utf-8")
        os.replace(tmp, folder / MARKER)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _new_manifest_data(folder: Path, fields: Mapping[str, Any],
                       pending: tuple[str, ...]) -> dict[str, Any]:
    return {"format": FORMAT, **fields, "pid": os.getpid(), "host": socket.gethostname(),
            "created": time.time(), "files": _listed_files(folder), "pending": list(pending)}


# -- atomic replacement --------------------------------------------------------------------
_renameat2: Any = None
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _load_renameat2() -> Any:
    global _renameat2
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        except (AttributeError, OSError):
            _renameat2 = False
    return _renameat2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap paths ``a`` and ``b``; False where the platform cannot."""
    if not _use_exchange or not sys.platform.startswith("linux"):
        return False
    fn = _load_renameat2()
    if not fn:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_into_place(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.rename(tmp, final)
        _step("swapped")
        return
    if _exchange(tmp, final):
        _step("swapped")
        _remove(tmp)  # now the previous dump
        _step("cleaned")
        return
    old = final.parent / f".{final.name}.{os.getpid()}.{_token()}.old"
    os.rename(final, old)
    _step("old-moved")
    try:
        os.rename(tmp, final)
    except OSError:
        os.rename(old, final)  # put the previous dump back
        raise
    _step("swapped")
    _remove(old)
    _step("cleaned")


def _retire(folder: Path) -> None:
    """Remove another run's dump folder: renamed away first, so it vanishes at once."""
    trash = folder.parent / f".{folder.name}.{os.getpid()}.{_token()}.trash"
    os.rename(folder, trash)
    _step("retired")
    _remove(trash)


def replace_folder(final: Path, fill: Callable[[Path], None], fields: Mapping[str, Any], *,
                   pending: tuple[str, ...] = (), retire: tuple[Path, ...] = ()) -> DumpManifest:
    """Write dump folder ``final`` (filled by ``fill(tmp)``), replacing an earlier dump.

    The caller holds the scope's lock. ``retire`` names other dump folders to remove just before
    the new folder goes into place (another run's graphs of the same group). A failure leaves
    ``final`` as it was and no temporary folder; ``final`` is never a folder without a manifest.
    """
    if (final.exists() or final.is_symlink()) and not is_dump(final):
        raise GraphDumpError(f"{final} exists and is not a graph dump (it has no {MARKER} "
                             f"manifest); refusing to replace it")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".tmp",
                                    dir=final.parent))
    except OSError as error:
        raise GraphDumpError(f"cannot write into dump folder {final.parent}: {error}") from error
    try:
        _step("tmp-created")
        fill(tmp)
        _step("filled")
        data = _new_manifest_data(tmp, fields, pending)
        (tmp / MARKER).write_text(_manifest_text(data), encoding="utf-8")  # not yet visible
        _step("manifest-written")
        for folder in retire:
            _retire(folder)
        _swap_into_place(tmp, final)
    except GraphDumpError:
        _remove(tmp)
        raise
    except Exception as error:
        _remove(tmp)
        raise GraphDumpError(f"writing graph dump {final} failed, nothing written: "
                             f"{type(error).__name__}: {error}") from error
    except BaseException:
        _remove(tmp)
        raise
    return _manifest(final, data)


def add_file(folder: Path, name: str, write: Callable[[Path], None]) -> None:
    """Add ``name`` to dump ``folder`` (written by ``write(path)``) and list it in the manifest.

    The caller holds the scope's lock and has checked that the folder is the expected run's and
    lists ``name`` as pending.
    """
    tmp = _beside(folder)
    try:
        write(tmp)
        _step("file-written")
        os.replace(tmp, folder / name)
        _step("file-renamed")
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    data = _load_manifest_data(folder)
    assert data is not None
    data["files"] = dict(sorted({**data["files"],
                                 name: (folder / name).stat().st_size}.items()))
    data["pending"] = [p for p in data.get("pending", []) if p != name]
    _replace_manifest(folder, data)
    _step("manifest-updated")


def restore_orphan(folder: Path) -> bool:
    """If ``folder`` is missing but an orphaned ``.old`` copy of it exists, put it back.

    Used by readers that find a dump missing: the writer that was replacing it died between its
    two renames. Returns whether anything was found to recover.
    """
    parent = folder.parent
    try:
        orphans = [p for p in parent.iterdir()
                   if p.name.startswith(f".{folder.name}.") and p.name.endswith(".old")]
    except OSError:
        return False
    if not orphans:
        return False
    dumper = DumpScope.for_dumper(parent, parent.name)  # {folder_name}/{name}/{name}_kind_i
    scope = (dumper if dumper.lock_file.exists() and dumper.final_re().match(folder.name)
             else DumpScope.for_folder(folder))
    with scope.locked(for_reading=True):
        pass  # taking the lock tidies: the orphan goes back unless its writer is still alive
    return folder.exists()
