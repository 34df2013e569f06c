"""``kiln-decomp list [--table NAME] [--missing-from GRAPH_FILE] [--check]``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from kiln.graph import CORE_ATEN_OPS

from .registry import TABLE_NAMES, op_name
from .tables import table

_OP_NAME = re.compile(r"\b(?:torch\.ops\.)?(aten|kiln_prims)\.(\w+)\.(\w+)\b")


def ops_in_text(text: str) -> set[str]:
    """Operator names in a graph's text: ``print_graph`` output, ``gm.code``, or kiln debug dumps."""
    return {f"{ns}.{op}.{ov}" for ns, op, ov in _OP_NAME.findall(text)}


def _list(args: argparse.Namespace) -> int:
    tab = table(args.table)
    names = tab.names()
    if args.missing_from:
        used = ops_in_text(Path(args.missing_from).read_text())
        aten_used = sorted(u for u in used if u.startswith("aten."))
        if tab.dialect is not None and tab.dialect.value == "prims":
            missing = [u for u in aten_used if u not in names]
        else:
            missing = [u for u in aten_used if u not in names and u not in CORE_ATEN_OPS]
        print(f"{len(aten_used)} ATen ops in {args.missing_from}; {len(missing)} neither core nor in {args.table!r}:")
        for m in missing:
            print(f"  {m}")
        return 1 if missing else 0
    width = max(len(n) for n in names)
    by_name = {op_name(op): tab.entry(op) for op in tab}
    for n in names:
        print(f"{n:<{width}}  {by_name[n].family}")
    print(f"\n{len(names)} ops decomposed by table {args.table!r}; core ATen set: {len(CORE_ATEN_OPS)} ops")
    if args.check:
        return _check(args.table)
    print("tested against eager: run with --check (op_db samples, ~1 minute)")
    return 0


def _check(table_name: str) -> int:
    try:
        from .opinfo_check import check_all  # noqa: PLC0415 - needs torch's testing package
        report = check_all(table_name)
    except ImportError as e:
        print(f"cannot run the op_db check: {e}; install `expecttest` (torch's testing deps)", file=sys.stderr)
        return 2
    print(f"{len(report.checked)} ops matched eager on op_db samples; {len(report.failures)} mismatches")
    for f in report.failures[:20]:
        print(f"  FAIL {f[:200]}")
    return 1 if report.failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln-decomp", description="kiln decomposition tables")
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="list a table's decompositions and coverage")
    lst.add_argument("--table", default="core_aten", choices=TABLE_NAMES)
    lst.add_argument("--missing-from", metavar="GRAPH_FILE",
                     help="a graph's text (print_graph output, gm.code, a KILN_DEBUG_DIR dump): list its ops "
                          "that are neither core nor decomposed by the table")
    lst.add_argument("--check", action="store_true", help="also cross-check the table against eager on op_db")
    args = parser.parse_args(argv)
    try:
        return _list(args)
    except BrokenPipeError:  # `kiln-decomp list | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
