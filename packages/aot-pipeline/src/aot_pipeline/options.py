"""The pipeline's options, validated once, shared by ``compile()``, the back end and the CLI."""

from __future__ import annotations

import decimal
import difflib
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

# The knapsack solvers aot_partition offers for the activation-memory budget (seed 000).
SOLVERS: tuple[str, ...] = ("dp", "greedy", "ilp", "ilp_graph", "dp_graph")
# "inductor" compiles forward and backward to Triton (CUDA) or C++ (CPU); the others are
# aot_compilers' graph compilers, run by name.
COMPILERS: tuple[str, ...] = ("inductor", "nop", "debug_nop", "print_compile", "ts_compile")
# Our own option names, in ``torch.compile(..., options=...)`` next to Inductor config keys.
PIPELINE_OPTION_NAMES: tuple[str, ...] = ("compiled_autograd", "compiler", "defer_full_gc",
                                          "memory_budget", "memory_budget_best_effort",
                                          "memory_budget_bytes", "memory_peak_bytes",
                                          "memory_peak_fraction", "solver", "split")
# Units of a byte budget ("300MiB", "1.5GB"): SI powers of 1000 and IEC powers of 1024.
BYTE_UNITS: dict[str, int] = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# ASCII only: str.isdigit and float() also read other scripts' digits ("٥", "５"), which a
# budget written in a config file or on a command line is far more likely to be by mistake.
_SIZE_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*$",
                           re.ASCII)
_FRACTION_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$",
                               re.ASCII)
# The largest byte cap accepted: 2**63 - 1 (8 EiB), the largest size torch can describe.
MAX_BUDGET_BYTES = 2**63 - 1
# Text longer than this is echoed shortened in an error message.
_ECHO_LIMIT = 200
# A peak cap is a size or a fraction followed by the word "peak": "20GiB peak", "0.8 peak".
_PEAK_SUFFIX = re.compile(r"\s+peak\s*$", re.ASCII | re.IGNORECASE)
# The forms memory_budget takes, for error messages.
BUDGET_FORMS = ("a fraction in [0, 1] (e.g. 0.5), a size with a unit (e.g. '300MiB'; units: B, "
                "kB, MB, GB, TB, KiB, MiB, GiB, TiB) or a peak cap (e.g. '20GiB peak' or "
                "'0.8 peak')")


class PipelineOptionError(ValueError):
    """An option of the pipeline has a value it does not accept."""


@dataclass(frozen=True)
class Budget:
    """A memory budget as written: a fraction of the activations (``fraction``), a cap on the
    saved activation bytes (``nbytes``), or a cap on the step's modelled peak, in bytes
    (``peak_bytes``, "20GiB peak") or as a fraction of the peak with no budget
    (``peak_fraction``, "0.8 peak")."""

    fraction: float = 1.0
    nbytes: int | None = None
    peak_bytes: int | None = None
    peak_fraction: float | None = None


@dataclass(frozen=True)
class PipelineOptions:
    """How the ``aot_pipeline`` back end partitions and compiles a graph.

    ``memory_budget`` is the fraction of the activations saved at budget 1.0 that the forward
    may keep for the backward (0.0 recomputes everything that can be recomputed), or a size
    with a unit (``"300MiB"``, ``"2GB"``): a cap on the saved activation bytes, kept in
    ``memory_budget_bytes`` (which may also be given as an int); ``solver`` picks the knapsack
    solver that decides what to recompute under that budget.

    ``mode`` is ``torch.compile``'s (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``,
    ``"max-autotune-no-cudagraphs"``), turned into Inductor config as ``backend="inductor"``
    does; ``inductor_options`` are ``torch._inductor.config`` settings, as ``(name, value)``
    pairs sorted by name (a mapping is accepted and converted). Both need ``compiler="inductor"``;
    the back end checks them against the installed torch.

    ``defer_full_gc`` (default True) defers CPython's full garbage collections while a graph
    compiles (``aot_pipeline.gc_deferral``).
    """

    memory_budget: float | str = 1.0
    solver: str = "dp"
    compiler: str = "inductor"
    compiled_autograd: bool = False
    mode: str | None = None
    inductor_options: tuple[tuple[str, Any], ...] = ()
    memory_budget_bytes: int | None = None
    memory_budget_best_effort: bool = False
    defer_full_gc: bool = True
    memory_peak_bytes: int | None = None
    memory_peak_fraction: float | None = None
    # The LM head and its loss in chunks of tokens (aot_partition.split.token_split): "auto"
    # splits only when a peak cap cannot be met otherwise, False never, an int N >= 2 always.
    split: str | int | bool = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.memory_budget, str):
            # The string's form given again in its own field (not None): refused unless equal.
            check_budget_given_once({"memory_budget": self.memory_budget, **{
                name: getattr(self, name) for name in BUDGET_OPTIONS[1:]
                if getattr(self, name) is not None}})
            budget = parse_budget_text(self.memory_budget)
            for name, value in (("memory_budget_bytes", budget.nbytes),
                                ("memory_peak_bytes", budget.peak_bytes),
                                ("memory_peak_fraction", budget.peak_fraction)):
                if value is not None:
                    object.__setattr__(self, name, value)
            object.__setattr__(self, "memory_budget", budget.fraction)
        validate_memory_budget(self.memory_budget)
        if self.memory_budget_bytes is not None:
            object.__setattr__(self, "memory_budget_bytes",
                               validate_budget_bytes(self.memory_budget_bytes))
        if self.memory_peak_bytes is not None:
            object.__setattr__(self, "memory_peak_bytes",
                               validate_budget_bytes(self.memory_peak_bytes, "memory_peak_bytes"))
        if self.memory_peak_fraction is not None:
            object.__setattr__(self, "memory_peak_fraction",
                               validate_peak_fraction(self.memory_peak_fraction))
        for name in ("memory_budget_best_effort", "defer_full_gc", "compiled_autograd"):
            _validate_bool(name, getattr(self, name))
        _validate_choice("solver", self.solver, SOLVERS)
        _validate_choice("compiler", self.compiler, COMPILERS)
        object.__setattr__(self, "split", validate_split(self.split))
        if self.mode is not None and not isinstance(self.mode, str):
            raise PipelineOptionError(
                f"mode must be a string or None, got {self.mode!r} ({type(self.mode).__name__})"
            )
        pairs = inductor_pairs(self.inductor_options)
        object.__setattr__(self, "inductor_options", pairs)
        if self.compiler != "inductor":
            given = [f"mode={self.mode!r}"] if self.mode not in (None, "default") else []
            given += [f"Inductor option {key!r}" for key, _ in pairs]
            if given:
                raise PipelineOptionError(
                    f"{', '.join(given)} can only be used with compiler='inductor' "
                    f"(got {self.compiler!r})"
                )

    @property
    def inductor_config(self) -> dict[str, Any]:
        """``inductor_options`` as a dict of ``torch._inductor.config`` settings."""
        return dict(self.inductor_options)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None, base: PipelineOptions,
                     inductor_keys: Collection[str] = ()) -> PipelineOptions:
        """``base`` with ``options`` (e.g. ``torch.compile(..., options=...)``) applied on top.

        Keys are our options (``PIPELINE_OPTION_NAMES``) or, when ``inductor_keys`` (the
        ``torch._inductor.config`` names) is given, Inductor config settings (``-`` may stand
        for ``_``, as in ``torch.compile``); anything else is a ``PipelineOptionError``.
        """
        ours, inductor = split_options(options, inductor_keys)
        check_budget_given_once(ours)
        if ours.keys() & set(BUDGET_OPTIONS):  # a budget given replaces base's in every form
            ours = {**dict.fromkeys(BUDGET_OPTIONS[1:]), **ours}
        if inductor:
            ours["inductor_options"] = {**base.inductor_config, **inductor}
        return replace(base, **ours) if ours else base


# One budget, written in one of its forms: giving one sets the others to theirs.
BUDGET_OPTIONS = ("memory_budget", "memory_budget_bytes", "memory_peak_bytes",
                  "memory_peak_fraction")


def check_budget_given_once(given: Mapping[str, Any]) -> None:
    """A PipelineOptionError when ``given`` (options as a caller wrote them) sets one budget
    twice: the saved-bytes cap both as ``memory_budget="64KiB"`` and ``memory_budget_bytes``,
    the peak cap in two of ``memory_budget="... peak"``, ``memory_peak_bytes`` and
    ``memory_peak_fraction``, or a fraction next to a cap (a cap replaces the fraction). Equal
    values pass ("64KiB" and 65536). The message names both options, their values and says to
    give one. A value that cannot be read is left to the option's own check."""
    stated: list[tuple[str, str, object]] = []  # (option, what it sets, the amount)
    for option in BUDGET_OPTIONS:
        value = given.get(option)
        if value is None:
            continue
        try:
            amount = _budget_amount(option, value)
        except PipelineOptionError:
            continue
        if amount is not None:
            stated.append((option, *amount))
    fractions = [entry for entry in stated if entry[1] == "fraction"]
    caps = [entry for entry in stated if entry[1] != "fraction"]
    if fractions and caps:
        (option, _, _), (cap_option, _, _) = fractions[0], caps[0]
        raise PipelineOptionError(
            f"aot_pipeline options {option}={echo_value(given[option])} and "
            f"{cap_option}={echo_value(given[cap_option])} both set the memory budget, and a "
            f"cap replaces the fraction (it would be ignored); give one: "
            f"{option}={echo_value(given[option])} or "
            f"{cap_option}={echo_value(given[cap_option])}")
    for i, (option, what, size) in enumerate(caps):
        for other, other_what, other_size in caps[i + 1:]:
            if what == other_what and size != other_size:
                first, second = echo_value(given[option]), echo_value(given[other])
                raise PipelineOptionError(
                    f"aot_pipeline options {option}={first} and {other}={second} both set "
                    f"the {what} ({_amount_words(size)} and {_amount_words(other_size)}); "
                    f"give it once: {option}={first} or {other}={second}")


def _budget_amount(option: str, value: object) -> tuple[str, object] | None:
    """What a budget option sets ("fraction", "saved-bytes cap", "peak cap") and its amount
    (a fraction; bytes; for a peak, ("bytes", n) or ("fraction", f)); None for a fraction of
    1.0 (no limit: what a cap leaves the fraction at). PipelineOptionError if unreadable."""
    if option == "memory_budget_bytes":
        return "saved-bytes cap", validate_budget_bytes(value)
    if option == "memory_peak_bytes":
        return "peak cap", ("bytes", validate_budget_bytes(value, option))
    if option == "memory_peak_fraction":
        return "peak cap", ("fraction", validate_peak_fraction(value))
    if isinstance(value, str):
        budget = parse_budget_text(value)
        if budget.nbytes is not None:
            return "saved-bytes cap", budget.nbytes
        if budget.peak_bytes is not None:
            return "peak cap", ("bytes", budget.peak_bytes)
        return "peak cap", ("fraction", budget.peak_fraction)
    fraction = validate_memory_budget(value)
    return None if fraction == 1.0 else ("fraction", fraction)


def _amount_words(amount: object) -> str:
    if isinstance(amount, tuple):
        kind, number = amount
        return f"{number} bytes" if kind == "bytes" else f"{number:g} of the uncapped peak"
    return f"{amount} bytes"


def split_options(options: Mapping[str, Any] | None,
                  inductor_keys: Collection[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` split into ours and Inductor's (names normalised), or a PipelineOptionError."""
    if not options:
        return {}, {}
    if not isinstance(options, Mapping):
        raise PipelineOptionError(
            f"options must be a dict of option names to values, got {type(options).__name__}"
        )
    bad_names = [key for key in options if not isinstance(key, str)]
    if bad_names:
        raise PipelineOptionError(
            f"aot_pipeline option names must be strings, got {', '.join(map(repr, bad_names))}; "
            f"valid options are {', '.join(PIPELINE_OPTION_NAMES)} and torch._inductor.config "
            "settings"
        )
    ours: dict[str, Any] = {}
    inductor: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in options.items():
        if key in PIPELINE_OPTION_NAMES:
            ours[key] = value
        elif key.replace("-", "_") in inductor_keys:
            inductor[key.replace("-", "_")] = value
        else:
            unknown.append(key)
    if unknown:
        candidates = [*PIPELINE_OPTION_NAMES, *inductor_keys]
        hints = [f"{key!r} (did you mean {close[0]!r}?)"
                 if (close := difflib.get_close_matches(key, candidates, n=1)) else repr(key)
                 for key in sorted(unknown)]
        inductor_hint = (" or a torch._inductor.config setting "
                         "(torch._inductor.list_options())" if inductor_keys else "")
        raise PipelineOptionError(
            f"unknown aot_pipeline option(s) {', '.join(hints)}; "
            f"valid options are {', '.join(PIPELINE_OPTION_NAMES)}{inductor_hint}"
        )
    return ours, inductor


def inductor_pairs(options: object) -> tuple[tuple[str, Any], ...]:
    """A mapping (or iterable of pairs) of Inductor settings as sorted ``(name, value)`` pairs."""
    error = PipelineOptionError(
        f"inductor_options must be a dict of torch._inductor.config settings, got {options!r}"
    )
    items: object = options.items() if isinstance(options, Mapping) else options
    if not isinstance(items, Iterable):
        raise error
    try:
        pairs = tuple((key, value) for key, value in items)
    except (TypeError, ValueError):
        raise error from None
    bad = [key for key, _ in pairs if not isinstance(key, str)]
    if bad:
        raise PipelineOptionError(
            f"Inductor option names must be strings, got {', '.join(map(repr, bad))}"
        )
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


SPLIT_FORMS = "'auto', False (never) or a number of chunks >= 1 (1: never)"


def validate_split(split: object) -> str | int | bool:
    """``split`` as the pipeline keeps it: "auto", False, or an int >= 2 (1 becomes False)."""
    if split is False or split == "auto":
        return split
    if isinstance(split, str) and split.strip().isdigit():
        split = int(split.strip())
    if isinstance(split, int) and not isinstance(split, bool) and split >= 1:
        return split if split > 1 else False
    raise PipelineOptionError(f"split must be {SPLIT_FORMS}, got {echo_value(split)}")


def validate_memory_budget(budget: object) -> float:
    """``budget`` as a float in [0, 1], or a PipelineOptionError that says what is valid."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise PipelineOptionError(
            f"memory_budget must be a number in [0, 1], got {budget!r} ({type(budget).__name__})"
        )
    if math.isnan(budget) or not 0.0 <= budget <= 1.0:
        raise PipelineOptionError(
            f"memory_budget must be in [0, 1] (1.0 saves every activation the min-cut keeps, "
            f"0.0 recomputes as much as possible), got {budget}"
        )
    return float(budget)


def validate_budget_bytes(nbytes: object, what: str = "memory_budget_bytes") -> int:
    """``nbytes`` as an int >= 0, or a PipelineOptionError that says what is valid."""
    if (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0
            or nbytes > MAX_BUDGET_BYTES):
        example = "'300MiB'" if what == "memory_budget_bytes" else "'20GiB peak'"
        raise PipelineOptionError(
            f"{what} must be a whole number of bytes from 0 to {MAX_BUDGET_BYTES} "
            f"(or give memory_budget as a size such as {example}), got {echo_value(nbytes)}"
        )
    return nbytes


def validate_peak_fraction(fraction: object) -> float:
    """A peak cap's fraction of the no-budget peak: a number in (0, 1]."""
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
            or math.isnan(fraction) or not 0.0 < fraction <= 1.0):
        raise PipelineOptionError(
            f"memory_peak_fraction must be a number in (0, 1] (the share of the peak with no "
            f"budget, e.g. 0.8 or memory_budget='0.8 peak'), got {echo_value(fraction)}"
        )
    return float(fraction)


def echo_value(value: object) -> str:
    """``repr(value)``, shortened when long: an error message names a value, never floods."""
    text = repr(value)
    return text if len(text) <= _ECHO_LIMIT else f"{text[:_ECHO_LIMIT]}... ({len(text)} chars)"


def parse_byte_size(text: str, what: str = "size") -> int:
    """``"300MiB"`` -> 314572800: a number and a unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB;
    any case; ASCII digits), or a PipelineOptionError naming ``what``, the units and the range.
    A fractional number of bytes is rounded down."""
    match = _SIZE_PATTERN.match(text) if text.isascii() else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in BYTE_UNITS:
        raise PipelineOptionError(
            f"cannot read {what} {echo_value(text)}: write a number and a unit, e.g. '300MiB' or "
            f"'1.5GB' (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    number = float(match.group(1))  # finite or inf: the pattern admits no "nan"
    nbytes = number * BYTE_UNITS[unit]
    if nbytes < 1 and decimal.Decimal(match.group(1)) > 0:  # "1e-400MiB", "0.5B": not 0 bytes
        raise PipelineOptionError(
            f"{what} {echo_value(text)} is less than one byte; write 0B for no saved bytes")
    if not nbytes <= MAX_BUDGET_BYTES:
        raise PipelineOptionError(
            f"{what} {echo_value(text)} is too large: at most {MAX_BUDGET_BYTES} bytes (8 EiB)"
        )
    return int(nbytes)


def parse_peak(text: str) -> Budget | None:
    """``"20GiB peak"`` -> Budget(peak_bytes=...), ``"0.8 peak"`` -> Budget(peak_fraction=0.8);
    None when ``text`` does not end in "peak"; PipelineOptionError for a bad size or fraction."""
    match = _PEAK_SUFFIX.search(text) if text.isascii() else None
    if match is None:
        return None
    amount = text[:match.start()]
    if _FRACTION_PATTERN.match(amount):
        fraction = float(amount)
        if not 0.0 < fraction <= 1.0:
            raise PipelineOptionError(
                f"memory_budget {echo_value(text)}: a peak fraction must be in (0, 1] (the share "
                f"of the peak with no budget), got {fraction:g}")
        return Budget(peak_fraction=fraction)
    return Budget(peak_bytes=parse_byte_size(amount, "memory_budget peak"))


def parse_budget_text(text: str) -> Budget:
    """``memory_budget`` given as a string: a byte cap ("300MiB") or a peak cap ("20GiB peak",
    "0.8 peak"); a bare fraction must be a number (see ``parse_budget_size``)."""
    peak = parse_peak(text)
    return peak if peak is not None else Budget(nbytes=parse_budget_size(text))


def parse_budget(text: str) -> Budget:
    """A memory budget as written on a command line: a fraction ("0.5"), a byte cap
    ("300MiB"), a peak cap ("20GiB peak", "0.8 peak"). PipelineOptionError otherwise."""
    peak = parse_peak(text)
    if peak is not None:
        return peak
    fraction, nbytes = parse_memory_budget(text)
    return Budget(fraction=fraction, nbytes=nbytes)


def parse_budget_size(text: str) -> int:
    """``memory_budget`` given as a string: a size with a unit (``"300MiB"``), in bytes.

    A fraction must be a number (``0.5``, not ``"0.5"``): a string is read as a size only, so a
    typo cannot turn a byte cap into a fraction or back."""
    if _FRACTION_PATTERN.match(text):
        raise PipelineOptionError(
            f"memory_budget {echo_value(text)} is a string without a unit: give a fraction in [0, 1] "
            f"as a number (memory_budget={text.strip()}) or a size with a unit, e.g. '300MiB'"
        )
    return parse_byte_size(text, "memory_budget")


def parse_fraction(text: str) -> float:
    """A fraction in [0, 1] as written on a command line (ASCII digits), or a
    PipelineOptionError naming ``memory_budget``."""
    if not _FRACTION_PATTERN.match(text):
        raise PipelineOptionError(
            f"memory_budget must be a number in [0, 1] such as 0.5, got {echo_value(text)}"
        )
    return validate_memory_budget(float(text))


def parse_memory_budget(text: str) -> tuple[float, int | None]:
    """A fraction or a byte cap as written on a command line: ``"0.5"`` -> (0.5, None), a
    fraction in [0, 1]; ``"300MiB"`` -> (1.0, 314572800), a cap on saved activation bytes.
    ASCII only; anything else (a peak cap too: ``parse_budget`` reads every form) is a
    PipelineOptionError naming ``memory_budget``."""
    if _FRACTION_PATTERN.match(text):
        try:
            return validate_memory_budget(float(text)), None
        except PipelineOptionError as error:
            raise PipelineOptionError(
                f"{error} (or give a size with a unit, e.g. '300MiB', for a cap in bytes)"
            ) from None
    match = _SIZE_PATTERN.match(text) if text.isascii() else None
    if match is None or match.group(2).lower() not in BYTE_UNITS:
        raise PipelineOptionError(f"memory_budget must be {BUDGET_FORMS}, got {echo_value(text)}")
    return 1.0, parse_byte_size(text, "memory_budget")


def _validate_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PipelineOptionError(f"{name} must be True or False, got {value!r}")


def _validate_choice(what: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise PipelineOptionError(f"unknown {what} {value!r}; choose one of {', '.join(valid)}")


# A config value longer than this is refused: literal parsing of pathological text (100,000
# minus signs) exhausts memory or recursion.
MAX_CONFIG_VALUE_CHARS = 1000


def parse_key_values(text: str, flag: str) -> dict[str, Any]:
    """``n_layer=2,n_embd=128,use_cache=false`` as a dict: ints, floats, booleans, None and
    strings, read as Python literals where they are one."""
    import ast

    result: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            example = ("n_layer=2,n_embd=128,n_head=4" if flag == "--hf-config"
                       else "num_classes=10,depth=2")
            raise PipelineOptionError(f"{flag} {text!r}: give key=value pairs separated by commas, "
                                      f"e.g. {example}")
        if key in result:  # the first would be dropped
            raise PipelineOptionError(f"{flag}: {key} is given twice; give each key once")
        word = value.strip()
        if len(word) > MAX_CONFIG_VALUE_CHARS:
            shown = word[:20] + "..."
            raise PipelineOptionError(f"{flag}: the value of {key} ({shown!r}, {len(word)} "
                                      f"characters) is longer than {MAX_CONFIG_VALUE_CHARS}")
        lowered = word.lower()
        if lowered in ("true", "false"):
            result[key] = lowered == "true"
        elif lowered in ("none", "null"):
            result[key] = None
        else:
            try:
                result[key] = ast.literal_eval(word)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                result[key] = word
    return result
