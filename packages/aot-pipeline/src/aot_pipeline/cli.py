"""``aot-pipeline``: train the built-in models, sweep the memory budget, explain a partition.

Bad arguments end with exit status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from .cli_help import command_help, no_command_hint
from .model_names import MODEL_NAMES, VARIANTS
from .options import (
    COMPILERS,
    SOLVERS,
    PipelineOptionError,
    echo_value,
    parse_budget,
    parse_fraction,
    parse_key_values,
)

log = logging.getLogger(__name__)

PROG = "aot-pipeline"
USAGE_ERROR = 2
# The built-in models are tiny but a CPU run still grows with depth: beyond this a typo (1000
# for 10) would run for hours before anyone noticed.
MAX_LAYERS = 64
MAX_STEPS = 100_000
_WHOLE_NUMBER = re.compile(r"^\s*[0-9]{1,18}\s*$", re.ASCII)
_echo = echo_value
_LONG_WORD_KEPT = 200
_LONG_WORD = re.compile(rf"\S{{{_LONG_WORD_KEPT + 1},}}")


class UsageError(Exception):
    """A bad command line; printed as one line."""


class OutputError(Exception):
    """An output file could not be written; printed as one line (nothing is left behind)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse quotes the bad value in full ("invalid choice: '...'"): shorten long ones.
        # Our own checks' messages come here too, already shortened (ending in "...").
        raise UsageError(_LONG_WORD.sub(
            lambda m: m[0] if m[0].endswith("...")
            else f"{m[0][:_LONG_WORD_KEPT]}... ({len(m[0])} chars)", message))


def _budget(text: str) -> float:
    try:
        return parse_fraction(text)
    except PipelineOptionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _budget_or_size(text: str) -> float | str:
    """A fraction in [0, 1] ("0.5"), a byte cap with a unit ("300MiB") or a peak cap ("20GiB
    peak", "0.8 peak"), checked here; the caps stay text (PipelineOptions reads them)."""
    try:
        budget = parse_budget(text)
    except PipelineOptionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if budget.nbytes is None and budget.peak_bytes is None and budget.peak_fraction is None:
        return budget.fraction
    return text.strip()


def _peak_cap(text: str) -> str:
    """``--capped-budget``: a peak cap ("0.8 peak", "200MiB peak"), checked here."""
    try:
        budget = parse_budget(text)
    except PipelineOptionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if budget.peak_bytes is None and budget.peak_fraction is None:
        raise argparse.ArgumentTypeError(
            f"{_echo(text)} is not a peak cap: write a size or a fraction followed by 'peak', "
            "e.g. '0.8 peak' or '200MiB peak'")
    return text.strip()


def _whole_number(text: str, maximum: int) -> int:
    # ASCII digits only: int() also reads "５" and "1_000".
    if not _WHOLE_NUMBER.match(text):
        raise argparse.ArgumentTypeError(f"{_echo(text)} is not a whole number") from None
    value = int(text)
    if not 1 <= value <= maximum:
        raise argparse.ArgumentTypeError(f"must be between 1 and {maximum}, got {value}")
    return value


def _layers(text: str) -> int:
    return _whole_number(text, MAX_LAYERS)


def _steps(text: str) -> int:
    return _whole_number(text, MAX_STEPS)


def _budget_list(text: str) -> list[float]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; give budgets in [0, 1] "
                                         "separated by commas, e.g. 1,0.5,0")
    return [_budget(item) for item in items]


def _variant_list(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(VARIANTS)}")
    return variants


def _model_name(text: str) -> str:
    """A built-in model's name, or a factory target with a ':' (checked when it is built)."""
    if text in MODEL_NAMES or ":" in text:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a built-in model ({', '.join(MODEL_NAMES)}) nor a factory "
        "'package.module:function' / 'path/to/file.py:function'")


class _KeyValues(argparse.Action):
    """``--hf-config`` / ``--model-config K=V,...``: parsed here, where the option the user
    typed is known, so an error names that one; given twice is refused (the first would be
    dropped)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        flag = option_string or self.option_strings[0]
        earlier = getattr(namespace, "model_config_flag", None)
        if earlier is not None:
            parser.error(f"{earlier} given twice ({flag} too); give every key=value pair in one, "
                         "separated by commas")
        try:
            config = parse_key_values(str(values), flag)
        except PipelineOptionError as error:
            parser.error(str(error))
        setattr(namespace, self.dest, config)
        namespace.model_config_flag = flag


def model_spec(args: argparse.Namespace) -> Any:
    """The ``ModelSpec`` the model arguments name."""
    inputs = tuple(args.inputs)
    source = next((s for s in ("hf", "torchvision", "timm", "exported")
                   if getattr(args, s, None) is not None), None)
    config_flag = getattr(args, "model_config_flag", None)
    if source is None and args.model in MODEL_NAMES and (config_flag or inputs):
        given = [flag for flag in (config_flag, "--input" if inputs else None) if flag]
        raise UsageError(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for your own "
                         "model (--model package.module:factory, --hf, ...), not the built-in "
                         f"{args.model!r}")
    if source == "exported":  # its archive's declared sizes, before torch is imported
        from .exported_archive import check_archive_sizes

        check_archive_sizes(str(args.exported))
    from .user_models import ModelSpec

    if source is not None:
        return ModelSpec(source, str(getattr(args, source)), config=args.model_config,
                         inputs=inputs, config_flag=config_flag)
    if args.model in MODEL_NAMES:
        return ModelSpec("builtin", args.model, layers=args.layers)
    return ModelSpec("factory", args.model, config=args.model_config, inputs=inputs,
                     config_flag=config_flag)


def _output_file(suffix: str | None) -> Any:
    """An argparse type for a file the command writes at the end: checked before any work.

    The path must end in ``suffix`` (when given) and be a regular file (or a link to one) or
    not exist yet, under a writable directory (missing folders are created on write): a FIFO
    would block the write, a device would swallow or refuse it, a directory cannot take it.
    """

    def check(text: str) -> Path:
        try:
            return _checked_output_path(text, suffix)
        except OutputError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def _checked_output_path(text: str, suffix: str | None) -> Path:
    path = Path(text)
    if not text or "\0" in text:
        raise OutputError(f"{_echo(text)} is not a file path")
    try:
        mode: int | None = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:  # a file where a folder of the path should be
        ancestor = path.absolute().parent
        while not ancestor.is_file() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        raise OutputError(f"cannot write {_echo(text)}: {str(ancestor)!r} is not a "
                          "directory") from None
    except OSError as error:  # a link loop, a name too long, a file used as a folder ...
        raise OutputError(_os_error_words(text, error)) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError(f"{_echo(text)} is a directory; give a file path")
    if suffix is not None and path.suffix.lower() != suffix:
        raise OutputError(f"{_echo(text)} must name a {suffix} file")
    if mode is not None:
        if not stat.S_ISREG(mode):
            raise OutputError(f"cannot write {_echo(text)}: it is a {_file_kind(mode)}, not a "
                              "regular file; give a file path")
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {_echo(text)}: the file is not writable")
        if not os.access(path.absolute().parent, os.W_OK | os.X_OK):  # the new copy goes there
            raise OutputError(f"cannot write {_echo(text)}: directory "
                              f"{str(path.absolute().parent)!r} is not writable")
        return path
    if path.is_symlink():
        raise OutputError(f"cannot write {_echo(text)}: it is a link to a missing file; give "
                          "the target's path")
    ancestor = path.absolute().parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"cannot write {_echo(text)}: {str(ancestor)!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {_echo(text)}: directory {str(ancestor)!r} is not "
                          "writable")
    name_max = _name_max(ancestor)
    too_long = [part for part in path.parts if len(os.fsencode(part)) > name_max]
    if too_long:
        raise OutputError(f"cannot write {_echo(text)}: the name {_echo(too_long[0])} is longer "
                          f"than {name_max} bytes, the most this file system allows")
    return path


def _name_max(directory: Path) -> int:
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
    return next((kind for test, kind in kinds if test(mode)), "special file")


def _os_error_words(text: str, error: OSError) -> str:
    return f"cannot write {_echo(text)}: {error.strerror or error}"


def _write_output(path: Path, write: Any) -> None:
    """``write(temporary_path)`` then move the result to ``path``: a failed write (disk full,
    the path changed since it was checked) leaves nothing behind and is an OutputError."""
    temporary: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".aot-pipeline-",
                                             suffix=path.suffix)
        os.close(handle)
        write(Path(temporary))
        if path.exists() and not path.is_file():
            raise OutputError(f"cannot write {_echo(str(path))}: it is no longer a regular file")
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        raise OutputError(_os_error_words(str(path), error)) from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _write_text(path: Path, text: str) -> None:
    _write_output(path, lambda temporary: temporary.write_text(text))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Train the built-in models with the aot_pipeline "
                     "back end, sweep the memory budget, explain a partition.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    # Not required: without a command, main() prints cli_help's hint instead of argparse's error.
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    def model_args(sub: argparse.ArgumentParser, default_layers: int,
                   exported: bool = False) -> None:
        source = sub.add_argument_group(
            "model", "a built-in model (default gpt), or your own: one of --model "
                     "package.module:factory, --hf, --torchvision, --timm"
                     + (", --exported" if exported else ""))
        choice = source.add_mutually_exclusive_group()
        choice.add_argument("--model", type=_model_name, default="gpt",
                            help=f"a built-in tiny model ({', '.join(MODEL_NAMES)}; default "
                                 "gpt) or a factory 'package.module:function' or "
                                 "'path/to/file.py:function' returning a module, or (module, "
                                 "inputs)")
        choice.add_argument("--hf", metavar="MODEL_TYPE",
                            help="a transformers architecture (an AutoConfig.for_model name "
                                 "such as gpt2, llama, vit) from a config, random weights")
        choice.add_argument("--torchvision", metavar="NAME",
                            help="a torchvision model by name (resnet18, ...), random weights")
        choice.add_argument("--timm", metavar="NAME",
                            help="a timm model by name (vit_tiny_patch16_224, ...), random "
                                 "weights")
        if exported:
            choice.add_argument("--exported", type=Path, metavar="FILE.pt2",
                                help="a program saved by torch.export.save; its example inputs")
        source.add_argument("--hf-config", "--model-config", dest="model_config",
                            action=_KeyValues, default={}, metavar="K=V,...",
                            help="config overrides for --hf (n_layer=2,n_embd=128,n_head=4), "
                                 "or keyword arguments of the factory / torchvision / timm "
                                 "constructor")
        source.add_argument("--input", dest="inputs", action="append", default=[],
                            metavar="SHAPE[:DTYPE[:HIGH]]",
                            help="an example input such as 2x128:int64:50257 (repeat for "
                                 "several); needed when a factory returns only a module")
        source.add_argument("--layers", type=_layers, default=default_layers,
                            help=f"layers/blocks of a built-in model, 1 to {MAX_LAYERS} "
                                 f"(default {default_layers})")

    train = commands.add_parser(
        "train", help="train eager, inductor and aot_pipeline side by side and compare",
        **command_help("train"))
    model_args(train, 2)
    train.add_argument("--steps", type=_steps, default=10,
                       help=f"SGD steps, 1 to {MAX_STEPS} (default 10)")
    train.add_argument("--memory-budget", type=_budget_or_size, default=None,
                       help="activation memory budget: a fraction in [0, 1] (default: the "
                            "partitioner flags, 1.0 when unset), "
                            "a cap on saved activation bytes such as 300MiB, or a cap on the "
                            "step's modelled peak such as '2GiB peak' or '0.8 peak'")
    train.add_argument("--capped-budget", type=_peak_cap, default=None,
                       help="the peak cap of the aot_pipeline_capped row, e.g. '0.8 peak' "
                            "(the default) or '200MiB peak': the whole step's peak")
    train.add_argument("--memory-budget-best-effort", action="store_true", default=None,
                       help="when a byte cap is unreachable, take the closest cut with a "
                            "warning instead of failing")
    train.add_argument("--solver", choices=SOLVERS, default=None,
                       help="knapsack solver (default: the flag, dp when unset)")
    train.add_argument("--split", type=_split, default=None,
                       help="the LM head and its cross-entropy in chunks of tokens: auto (only "
                            "when a peak cap is unreachable otherwise), off, or a chunk count "
                            "(default: the flag, auto when unset)")
    train.add_argument("--compiler", choices=COMPILERS, default="inductor",
                       help="compiler for our forward and backward (default inductor)")
    train.add_argument("--compiled-autograd", action="store_true",
                       help="run our backward through compiled autograd")
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cpu (default) or cuda")
    train.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                       help=f"comma-separated runs (default {','.join(VARIANTS)})")
    train.add_argument("--json", type=_output_file(None),
                       help="also write the results to this JSON file")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")

    pareto = commands.add_parser(
        "pareto", help="sweep the memory budget; plot the simulated peak against recompute, "
                       "ours and torch's", **command_help("pareto"))
    model_args(pareto, 2, exported=True)
    pareto.add_argument("--output", type=_output_file(".png"), default=Path("pareto.png"),
                        help="PNG to write (default pareto.png)")
    pareto.add_argument("--budgets", type=_budget_list,
                        help="comma-separated budgets in [0, 1] (default: the partitioner's)")
    pareto.add_argument("--no-torch", action="store_true",
                        help="skip torch's partitioner (its front and table columns)")
    pareto.add_argument("--no-progress", action="store_true", help="no progress bars")

    partition = commands.add_parser(
        "partition", help="show which activations are saved or recomputed, and why",
        **command_help("partition"))
    model_args(partition, 1, exported=True)
    partition.add_argument("--memory-budget", type=_budget_or_size, default=None,
                           help="activation memory budget: a fraction in [0, 1] (default: the "
                                "partitioner flags, 1.0 when unset), "
                                "a cap on saved activation bytes such as 300MiB, or a cap on "
                                "the step's modelled peak such as '2GiB peak' or '0.8 peak'")
    partition.add_argument("--memory-budget-best-effort", action="store_true", default=None,
                           help="when a byte cap is unreachable, take the closest cut with a "
                                "warning instead of failing")
    partition.add_argument("--solver", choices=SOLVERS, default=None,
                       help="knapsack solver (default: the flag, dp when unset)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # torch's pytree warns about its own deprecations when graphs are deep-copied: not ours.
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        args = build_parser().parse_args(_negative_inputs_joined(
            sys.argv[1:] if argv is None else list(argv)))
        if args.command is None:
            print(no_command_hint(), file=sys.stderr)
            return USAGE_ERROR
        _check_torch_trace(os.environ.get("TORCH_TRACE"))
        args.spec = model_spec(args)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        command = {"train": _train, "pareto": _pareto, "partition": _partition}[args.command]
        with _best_effort_warnings_as_lines():
            return command(args)
    except (UsageError, PipelineOptionError, OutputError) as error:
        print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:
        # The reader went away (`aot-pipeline partition ... | head`): stop quietly, as other
        # command-line tools do; stdout to devnull so the interpreter's final flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as error:
        from aot_partition import FlagConflictError

        if isinstance(error, FlagConflictError):  # torch's flag and ours disagree
            print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
            return USAGE_ERROR
        unreachable = _unreachable_budget(error)
        if unreachable is None:
            raise
        print(f"{PROG}: error: argument --memory-budget: {unreachable}; give "
              f"--memory-budget {unreachable.least}B or more, or --memory-budget-best-effort "
              "to take that cut with a warning", file=sys.stderr)
        return USAGE_ERROR


# An --input value that starts with a minus ("-1x4"), which argparse would take for an option.
_NEGATIVE_SHAPE = re.compile(r"^-[0-9]")


def _negative_inputs_joined(argv: list[str]) -> list[str]:
    """``--input -1x4`` as ``--input=-1x4``: argparse reads "-1x4" as an unknown option and
    says only "expected one argument"; joined, the shape reaches its own check, which says
    what is wrong with it (a negative dimension)."""
    joined: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--":  # the rest is positional: as typed
            joined += [item, *items]
            break
        if item == "--input":
            following = next(items, None)
            if following is not None and _NEGATIVE_SHAPE.match(following):
                joined.append(f"--input={following}")
                continue
            joined += [item] if following is None else [item, following]
            continue
        joined.append(item)
    return joined


def _check_torch_trace(folder: str | None) -> None:
    """TORCH_TRACE names the folder torch writes its structured trace to, at the end of the
    run: checked first, so a bad path fails before the work rather than after it."""
    if not folder:
        return
    path = Path(folder)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if path.exists() and not path.is_dir():
        raise UsageError(f"TORCH_TRACE={folder!r} is not a folder; point it at a folder for "
                         "torch's trace files, or unset it")
    if existing is not None and not existing.is_dir():
        raise UsageError(f"TORCH_TRACE={folder!r}: {str(existing)!r} is a file, not a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"TORCH_TRACE={folder!r}: {str(existing)!r} is not writable; point "
                         "it at a folder you can write, or unset it")
    # torch creates the folder at its first trace line, mid-compile, and a failure there is a
    # raw traceback; created now (as torch would), a folder that cannot be (under /proc, on a
    # read-only mount, which access() passes for root) fails first, in one line.
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"TORCH_TRACE={folder!r}: cannot create that folder "
                         f"({error.strerror or error}); point it at a folder you can write, or "
                         "unset it") from None


def _one_line(message: str) -> str:
    """``message`` with control characters (a newline or CR typed into an argument) escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in message)


def _unreachable_budget(error: BaseException) -> Any:
    """The UnreachableMemoryBudgetError behind ``error`` (torch.compile wraps what a back end
    raises, as BackendCompilerFailed or InductorError), else None."""
    if "aot_partition" not in sys.modules:  # nothing has partitioned: it cannot be that
        return None
    from aot_partition import UnreachableMemoryBudgetError

    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, UnreachableMemoryBudgetError):
            return current
        pending += [current.__cause__, current.__context__,
                    getattr(current, "inner_exception", None)]
    return None


@contextlib.contextmanager
def _best_effort_warnings_as_lines() -> Iterator[None]:
    """Each best-effort warning (an unreachable cap, the closest cut taken) printed as one
    ``aot-pipeline: warning: ...`` line on stderr, once each; other warnings as usual."""
    shown = warnings.showwarning
    said: set[str] = set()

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
             ) -> None:
        if category.__name__ != "MemoryBudgetBestEffortWarning":
            shown(message, category, *args, **kwargs)
        elif str(message) not in said:
            said.add(str(message))
            print(f"{PROG}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():  # restores showwarning and the filters afterwards
        warnings.showwarning = show
        # Every graph's warning reaches show() (the default shows one per code location).
        warnings.filterwarnings("always", message=r".*\(activation_memory_budget_best_effort\)")
        yield


def _train(args: argparse.Namespace) -> int:
    from .report import train_table
    from .train import (
        SHARED_CACHE_VARIABLE,
        TrainSettings,
        check_device,
        shared_inductor_cache,
        train_all,
    )

    check_device(args.device)
    variants = args.variants
    settings = TrainSettings(
        model=args.spec.label, layers=args.layers, steps=args.steps,
        memory_budget=args.memory_budget, model_spec=args.spec,
        solver=args.solver, compiler=args.compiler, compiled_autograd=args.compiled_autograd,
        device=args.device, variants=variants,
        memory_budget_best_effort=args.memory_budget_best_effort, split=args.split,
        **({"capped_budget": args.capped_budget} if args.capped_budget else {}),
    )
    options = settings.pipeline_options()  # a given option a set flag contradicts fails here
    shared_cache = shared_inductor_cache()  # a bad value fails here, before any variant runs
    # Each compiled variant in a fresh process with an empty Inductor cache (unless shared):
    # compile times are cold for all, not only for whichever variant happens to run first.
    results = train_all(settings, progress=not args.no_progress, isolated=True)
    print(f"{settings.spec().label}, {args.steps} steps on {args.device}; ours: "
          f"{_options_budget_words(options)}, solver {options.solver}, compiler {args.compiler}"
          f"{_split_words(options.split)}"
          f"{', compiled autograd' if args.compiled_autograd else ''}")
    print(train_table(results))
    if "aot_pipeline_capped" in variants:
        print(f"aot_pipeline_capped: ours under the peak cap '{settings.capped_budget}' (the "
              "whole step's peak, across graph breaks); step peaks above what is allocated "
              "before the step, predicted by CompiledModel.predicted_peak()")
    if options.memory_budget_bytes is not None:
        print("the saved-bytes cap and the table's saved activations count the same bytes: "
              "what the forward keeps alive beyond its inputs (parameters, buffers, the batch "
              "and views of them cost nothing)")
    if shared_cache:
        print(f"compile times are warm, not cold: {SHARED_CACHE_VARIABLE}=1 shares the caller's "
              "Inductor cache between the variants' processes")
    if args.json:
        payload = {"settings": {k: v for k, v in asdict(settings).items()},
                   "results": [asdict(r) for r in results]}
        _write_text(args.json, json.dumps(payload, indent=2, default=list))
    return 0 if all(r.matches_eager is not False for r in results) else 1


def _split(text: str) -> str | int | bool:
    """``--split``: auto, off (False) or a chunk count."""
    from .options import validate_split

    value: str | int | bool = False if text.strip().lower() in ("off", "false", "no") else text
    try:
        return validate_split(value)
    except PipelineOptionError as error:
        raise argparse.ArgumentTypeError(str(error).replace("False (never)", "off")) from None


def _split_words(split: str | int | bool) -> str:
    if split == "auto":
        return ""
    return ", split off" if split is False else f", split in {split}"


def _options_budget_words(options: Any) -> str:
    """The resolved options' budget in the reports' words."""
    from aot_partition.report.report import given_budget

    return given_budget(options.memory_budget, saved_bytes_cap=options.memory_budget_bytes,
                        peak_cap=options.memory_peak_bytes,
                        peak_fraction=options.memory_peak_fraction).describe()


def _budget_words(memory_budget: float | str) -> str:
    """The budget as aot_partition's reports name it: "memory budget 0.5", "saved-bytes cap
    300.0 MiB (314572800 bytes)"."""
    from aot_partition.report.report import given_budget

    if isinstance(memory_budget, str):
        budget = parse_budget(memory_budget)
        return given_budget(budget.fraction, saved_bytes_cap=budget.nbytes,
                            peak_cap=budget.peak_bytes,
                            peak_fraction=budget.peak_fraction).describe()
    return given_budget(memory_budget).describe()


def _joints(args: argparse.Namespace) -> list[Any]:
    """The joint graphs of the model: one for a built-in model (a direct trace, readable
    names); for the user's model, each graph ``torch.compile`` partitions (Dynamo capture)."""
    from .joint import trace_joint, trace_joints_compiled
    from .user_models import UserModelError

    built = args.spec.build()
    if args.spec.source == "builtin":
        return [trace_joint(built.module, built.make_inputs())]
    try:
        return trace_joints_compiled(built.module, built.make_inputs())
    except Exception as error:
        from aot_partition import FlagConflictError

        conflict = getattr(error, "inner_exception", None)
        if isinstance(conflict, FlagConflictError):  # the flags, not the model: said as such
            raise conflict from None
        raise UserModelError(f"{args.spec.label}: torch.compile could not trace it: "
                             f"{type(error).__name__}: {str(error).strip()[:300]}") from error


def _graph_label(args: argparse.Namespace, index: int, count: int) -> str:
    return args.spec.label + (f", graph {index + 1} of {count}" if count > 1 else "")


def _pareto(args: argparse.Namespace) -> int:
    from aot_partition import PartitionConfig, memory_budget_pareto
    from aot_partition.report.pareto import DEFAULT_BUDGETS, plot_peak_front

    budgets = list(args.budgets if args.budgets is not None else DEFAULT_BUDGETS)
    estimator = PartitionConfig.from_flags().runtime_estimator
    joints = _joints(args)
    # Several graphs (graph breaks): sweep the largest, where the budget matters most.
    index = max(range(len(joints)), key=lambda i: len(joints[i].module.graph.nodes))
    joint, label = joints[index], _graph_label(args, index, len(joints))
    points = memory_budget_pareto(joint.module, joint.inputs,
                                  num_fwd_outputs=joint.num_fwd_outputs, budgets=budgets,
                                  progress=_progress(args, "ours"))
    theirs = None if args.no_torch else _torch_front(joint, budgets, estimator,
                                                     _progress(args, "torch"))
    print(f"{label}: memory against recompute over budgets")
    print(_pareto_table(points, theirs))
    print("memory ratio: saved bytes between 0 (the least-memory cut, budget 0) and 1 (the "
          "runtime-optimal cut); recompute runtime: the knapsack's estimate of what the backward "
          "recomputes; peak: simulated forward+backward peak, inputs and parameters included; "
          f"recompute est.: {estimator} estimate of the forward ops the backward runs again "
          "(one formula for ours and torch's)")
    fronts: dict[str, Any] = {f"ours ({label})": points}
    if theirs:
        fronts["torch"] = theirs
    _write_output(args.output, lambda temporary: plot_peak_front(
        fronts, temporary, estimator=estimator,
        title=f"{label}: simulated peak vs. recompute"))
    print(f"wrote {args.output}")
    return 0


def _progress(args: argparse.Namespace, label: str) -> Any:
    """A tqdm wrapper for a loop over budgets (None with --no-progress)."""
    if args.no_progress:
        return None
    from tqdm import tqdm

    return lambda budgets: tqdm(budgets, desc=f"{label:>6}", unit="budget", file=sys.stderr,
                                leave=False)


def _torch_front(joint: Any, budgets: Sequence[float], estimator: str, progress: Any
                 ) -> list[Any] | None:
    """torch's min-cut partition of the same joint at each budget, scored like ours
    (``aot_partition.report.pareto.score_partition``); None when torch's partitioner is missing or
    fails (said on stderr: the comparison is optional)."""
    import copy

    try:
        from torch._functorch import config as torch_config
        from torch._functorch.partitioners import min_cut_rematerialization_partition
    except ImportError as error:
        print(f"{PROG}: torch's partitioner is not available ({error}); plotting ours only",
              file=sys.stderr)
        return None
    from aot_partition.report.pareto import score_partition

    points = []
    try:
        for budget in (progress(budgets) if progress is not None else budgets):
            with torch_config.patch(activation_memory_budget=budget):
                fw, bw = min_cut_rematerialization_partition(
                    copy.deepcopy(joint.module), joint.inputs,
                    num_fwd_outputs=joint.num_fwd_outputs)
            points.append(score_partition(fw, bw, budget, estimator=estimator))
    except Exception as error:  # torch's internals: any failure only drops the comparison
        log.warning("torch's partitioner failed", exc_info=True)
        print(f"{PROG}: torch's partitioner failed ({type(error).__name__}: {error}); "
              "plotting ours only", file=sys.stderr)
        return None
    return points


def _pareto_table(points: Sequence[Any], theirs: Sequence[Any] | None) -> str:
    from .report import format_bytes, format_table

    headers = ["budget", "memory ratio", "saved bytes", "recompute runtime", "peak",
               "recompute est."]
    if theirs is not None:
        headers += ["torch peak", "torch recompute est."]
    rows = []
    for i, p in enumerate(points):
        row = [f"{p.budget:.3f}", f"{p.memory_ratio:.3f}", _saved_bytes_cell(p),
               f"{p.recompute_runtime:.4g}", format_bytes(p.simulated_peak_bytes),
               _number_cell(p.recompute_estimate)]
        if theirs is not None:
            row += [format_bytes(theirs[i].simulated_peak_bytes),
                    _number_cell(theirs[i].recompute_estimate)]
        rows.append(row)
    return format_table(headers, rows)


def _number_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _saved_bytes_cell(point: Any) -> str:
    from .report import format_bytes

    return format_bytes(getattr(point, "saved_bytes", None))


def _partition(args: argparse.Namespace) -> int:
    from aot_config import functorch as functorch_flags
    from aot_partition import explain_partition

    from .backend import with_explicit_options
    from .report import format_bytes, format_table

    joints = _joints(args)  # first: a model file may set partitioner flags when imported
    given = {"memory_budget": args.memory_budget, "solver": args.solver,
             "memory_budget_best_effort": args.memory_budget_best_effort}
    # Unset arguments come from the partitioner flags; a set flag contradicting one fails.
    options = with_explicit_options({k: v for k, v in given.items() if v is not None})
    fraction = float(options.memory_budget)  # a float once the options are resolved
    for index, joint in enumerate(joints):
        # A peak is priced as Inductor, the compiler `train` and torch.compile use, compiles it.
        with functorch_flags.patch(
                activation_memory_budget_solver=options.solver,
                activation_memory_budget_bytes=options.memory_budget_bytes,
                activation_memory_peak_bytes=options.memory_peak_bytes,
                activation_memory_peak_fraction=options.memory_peak_fraction,
                activation_memory_model="inductor",
                activation_memory_budget_best_effort=options.memory_budget_best_effort):
            # Parameters as static-lifetime inputs, as torch.compile passes them (and `train`
            # partitions): a byte cap then counts the same bytes in both commands.
            report = explain_partition(joint.module, joint.inputs,
                                       num_fwd_outputs=joint.num_fwd_outputs,
                                       memory_budget=fraction,
                                       static_lifetime_input_indices=joint.static_input_indices)
        # The report's words for the budget and its one measure of saved bytes (inputs and
        # views of them cost nothing): the same numbers the byte cap compares.
        print(f"{'' if index == 0 else chr(10)}{_graph_label(args, index, len(joints))}, "
              f"{report.given_budget.describe()} (knapsack solver {options.solver}; decided by "
              f"{report.solver}): {len(report.saved)} saved "
              f"({format_bytes(report.saved_bytes)}), {len(report.recomputed)} recomputed")
        for title, decisions in (("saved for backward", report.saved),
                                 ("recomputed in backward", report.recomputed)):
            print(f"\n{title}:")
            print(format_table(["node", "op", "bytes", "why"],
                               [[d.name, d.op, d.nbytes, d.reason] for d in decisions]))
        if report.banned:
            print("\nbanned from recompute (must be saved if the backward needs them):")
            print(format_table(["node", "reason"], sorted(report.banned.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
