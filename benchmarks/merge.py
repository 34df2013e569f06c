"""Merge the ``suite.json`` of several runs (e.g. the parts of gpu_suite.sh) into one report.

    python -m benchmarks.merge OUT1/suite.json OUT2/suite.json ... --out DIR

For each (model, mode, backend) a measured row beats an error row, and a later file beats an
earlier one; rows that were only skipped for budget stay as "not run". Writes ``suite.md``,
``suite.json`` and ``suite_speedup.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kiln_bench import suite_report
from benchmarks.kiln_bench.report import write_json


def _rank(row: dict[str, Any]) -> int:
    error = row.get("error")
    if not error:
        return 2  # measured
    return 0 if str(error).startswith("not run") else 1  # skipped for budget < failed


def merge_rows(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for payload in payloads:
        for row in payload["rows"]:
            key = (row["model"], row["mode"], row["backend"])
            if key not in merged or _rank(row) >= _rank(merged[key]):
                merged[key] = row
    return list(merged.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    payloads = [json.loads(f.read_text()) for f in args.files]
    rows = merge_rows(payloads)
    info = dict(payloads[0]["meta"])
    info["command"] = " ; ".join(pl["meta"]["command"] for pl in payloads)
    settings = dict(payloads[0]["settings"], merged_from=len(payloads))
    args.out.mkdir(parents=True, exist_ok=True)
    md = suite_report.markdown(rows, info, settings)
    why = suite_report.chart(args.out / "suite_speedup.png", rows,
                             f"speedup over eager on {info.get('gpu') or 'CPU'}")
    if why:
        md += f"\n({why})\n"
    (args.out / "suite.md").write_text(md)
    write_json(args.out / "suite.json", {"meta": info, "settings": settings, "rows": rows,
                                         "geomean": suite_report.geomeans(rows),
                                         "parts": [pl["meta"] for pl in payloads]})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
