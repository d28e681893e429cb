"""The size check of an ``--exported`` ``.pt2`` archive, by the sizes its zip directory
declares: nothing of a member is read, and torch is not imported (the CLI runs it first).

torch.export.load reads each member whole and holds the program in memory about twice over
(a 3 GiB member took 7 GB), whether the member is stored or deflated; a small deflated file
may also expand to gigabytes. Either is refused here, before any of it is read.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from .options import PipelineOptionError

__all__ = ["MAX_EXPORTED_BYTES", "MAX_EXPORTED_RATIO", "ExportedArchiveError",
           "check_archive_sizes"]

# What the members of an --exported archive may declare in all, uncompressed: the CLI explains
# and sweeps a program's graph, for which a model's configuration small enough to trace on one
# machine will do.
MAX_EXPORTED_BYTES = 2 << 30
# Uncompressed / compressed, beyond which a member over 64 MiB is a zip bomb.
MAX_EXPORTED_RATIO = 1000
_RATIO_CHECKED_FROM = 64 << 20


class ExportedArchiveError(PipelineOptionError):
    """An --exported archive declares more than the command will read; the message names the
    file, the member and the limit."""


def check_archive_sizes(name: str) -> None:
    """Refuse ``name`` (a .pt2 zip archive) when its members declare more than
    ``MAX_EXPORTED_BYTES`` uncompressed in all, or one over 64 MiB expands more than
    ``MAX_EXPORTED_RATIO`` times: read from the zip's directory only. A path that is not a
    readable zip archive is left to the loader, which names what it is."""
    path = Path(name)
    try:
        if not path.is_file() or not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > _RATIO_CHECKED_FROM and ratio > MAX_EXPORTED_RATIO:
            raise ExportedArchiveError(
                f"--exported {name!r}: archive member {member.filename!r} expands to "
                f"{member.file_size} bytes from {member.compress_size}; refused before "
                "reading it (torch.export.save does not write such members)")
    total = sum(member.file_size for member in members)
    if total > MAX_EXPORTED_BYTES:
        largest = max(members, key=lambda member: member.file_size)
        raise ExportedArchiveError(
            f"--exported {name!r}: its members declare {total} bytes uncompressed (the largest, "
            f"{largest.filename!r}, {largest.file_size}), over the {MAX_EXPORTED_BYTES} "
            f"({MAX_EXPORTED_BYTES >> 30} GiB) --exported reads; refused before reading them "
            "(torch.export.load holds a program in memory about twice over): export the model "
            "in a smaller configuration")
