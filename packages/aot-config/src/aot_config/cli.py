"""``aot-config show [functorch|dynamo] [--changed] [--json]``: list every flag.

The table shows, per flag: name, type, current value, declared default, where the value comes
from (default, environment, forced by environment, set), the environment variable, whether the
flag is compile-ignored (``ci``), and its one-line doc.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from aot_config.config_module import ConfigModule, Flag

FLAG_SETS = ("functorch", "dynamo")
_VALUE_WIDTH = 28


def load_flag_set(name: str) -> ConfigModule:
    if name not in FLAG_SETS:
        raise ValueError(f"unknown flag set {name!r}: expected one of {', '.join(FLAG_SETS)}")
    return importlib.import_module(f"aot_config.{name}")  # type: ignore[return-value]


def is_changed(config: ConfigModule, flag: Flag) -> bool:
    """Differs from the declared default (environment variables count as changes)."""
    return getattr(config, flag.name) != flag.default


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname:
        return f"{module}.{qualname}"
    return repr(value)


def flag_record(config: ConfigModule, flag: Flag) -> dict[str, Any]:
    return {
        "name": flag.name,
        "type": flag.type_name(),
        "default": _jsonable(flag.default),
        "value": _jsonable(getattr(config, flag.name)),
        "source": config.value_source(flag.name),
        "changed": is_changed(config, flag),
        "env": flag.env,
        "env_forces": flag.env_forces,
        "compile_ignored": flag.compile_ignored or False,
        "choices": _jsonable(flag.choices) if flag.choices is not None else None,
        "range": list(flag.range) if flag.range is not None else None,
        "aliases": list(flag.aliases),
        "inert": flag.inert,
        "doc": flag.doc,
    }


def _short(text: str, width: int = _VALUE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(name: str, records: list[dict[str, Any]], width: int, total: int) -> str:
    header = ("flag", "type", "value", "default", "source", "env", "ci", "doc")
    rows = []
    for record in records:
        env = record["env"] or record["env_forces"] or ""
        rows.append(
            (
                record["name"] + (" *" if record["changed"] else ""),
                _short(record["type"], 18),
                _short(repr(record["value"])),
                _short(repr(record["default"])),
                "env"
                if record["source"].startswith("env")
                else "forced"
                if record["source"].startswith("forced")
                else record["source"],
                env,
                "yes" if record["compile_ignored"] else "",
                (f"[inert] {record['doc']}" if record["inert"] else record["doc"]),
            )
        )
    count = f"{total} flags" if len(records) == total else f"{len(records)} of {total} flags"
    title = f"{name}: {count}  (* = differs from default, ci = compile-ignored)"
    if not rows:
        return f"{title}\n  (no flags differ from their defaults)"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lead = sum(widths) + 2 * len(widths)
    # A narrow terminal gets the doc on its own indented line instead of a squeezed column.
    doc_inline = width - lead >= 40
    lines = [title]

    def line(cells: Sequence[str], doc: str = "") -> str:
        return ("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + "  " + doc).rstrip()

    lines.append(line(header[:-1], header[-1] if doc_inline else ""))
    lines.append(line(["-" * w for w in widths], "-" * 40 if doc_inline else ""))
    for row in rows:
        if doc_inline:
            doc_lines = textwrap.wrap(row[-1], width - lead) or [""]
            lines.append(line(row[:-1], doc_lines[0]))
            lines.extend(" " * lead + extra for extra in doc_lines[1:])
        else:
            lines.append(line(row[:-1]))
            lines.extend(
                textwrap.wrap(
                    row[-1], max(40, width - 6), initial_indent="      ", subsequent_indent="      "
                )
            )
    return "\n".join(lines)


def show(names: Sequence[str], changed_only: bool, as_json: bool, width: int) -> str:
    report: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    for name in names:
        config = load_flag_set(name)
        records = [flag_record(config, flag) for flag in config.flags().values()]
        totals[name] = len(records)
        if changed_only:
            records = [record for record in records if record["changed"]]
        report[name] = records
    if as_json:
        return json.dumps(report, indent=2, sort_keys=False)
    return "\n\n".join(
        render_table(name, records, width, totals[name]) for name, records in report.items()
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aot-config", description="Inspect the AOTAutograd (functorch) and dynamo flags."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    show_parser = commands.add_parser("show", help="list flags with defaults and current values")
    show_parser.add_argument(
        "flag_set", nargs="?", choices=FLAG_SETS, help="one flag set (default: both)"
    )
    show_parser.add_argument(
        "--changed", action="store_true", help="only flags that differ from their default"
    )
    show_parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [args.flag_set] if args.flag_set else list(FLAG_SETS)
    width = shutil.get_terminal_size((160, 24)).columns
    try:
        output = show(names, args.changed, args.json, width)
    except ValueError as error:
        # A malformed environment variable surfaces here, at import of the flag set.
        print(f"aot-config: error: {error}", file=sys.stderr)
        return 2
    try:
        print(output)
        sys.stdout.flush()
    except BrokenPipeError:
        # `aot-config show | head`: the reader left; stay quiet like other CLI tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
