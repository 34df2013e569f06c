"""Run every test root (the meta-package's and each stage's) in its own pytest process.

Each stage's tests are a package named ``tests``; one pytest process per root keeps them from
shadowing each other. ``KILN_TEST_ROOTS`` (comma-separated) runs only those roots. After each root it
prints the root's slowest tests (from its junit report), and at the end one line with the totals:
``N passed, N failed, N skipped``.

The workers get the longest files first (tools/pytest_order.py, from the seconds per file in
tools/test_durations.json), and a file with a module-scoped fixture goes whole to one worker
(``--dist loadgroup``): that fixture is built once, and no long file is left running alone at the end
of a root. ``--record-durations`` (before any pytest arguments)
rewrites that table's entries for the roots run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
DURATIONS = TOOLS / "test_durations.json"
ROOTS = ["tests", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/tests"))]


def _counts(junit: Path) -> tuple[int, int, int]:
    if not junit.exists():
        return 0, 1, 0
    tree = ET.parse(junit).getroot()
    suites = [tree] if tree.tag == "testsuite" else list(tree)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


def _slowest(junit: Path, n: int = 8) -> list[tuple[float, str]]:
    if not junit.exists():
        return []
    cases = ET.parse(junit).getroot().iter("testcase")
    timed = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in cases]
    return sorted(timed, reverse=True)[:n]


def _file_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests: a module fixture counts)."""
    seconds: dict[str, float] = {}
    if junit.exists():
        for c in ET.parse(junit).getroot().iter("testcase"):
            if c.get("file"):
                seconds[c.get("file", "")] = seconds.get(c.get("file", ""), 0.0) + float(c.get("time", 0))
    return seconds


def _record(seconds: dict[str, float], roots: list[str]) -> None:
    """Replace the table's entries under ``roots`` with ``seconds`` (rounded, longest first)."""
    try:
        old = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        old = {}
    kept = {f: t for f, t in old.items() if not any(f == r or f.startswith(r + "/") for r in roots)}
    table = {**kept, **{f: round(t, 1) for f, t in seconds.items() if t >= 0.05}}
    DURATIONS.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))), indent=0) + "\n")
    print(f"wrote {DURATIONS.relative_to(ROOT)} ({len(table)} files)")


def main(argv: list[str]) -> int:
    record = bool(argv) and argv[0] == "--record-durations"
    argv = argv[1:] if record else argv
    workers = os.environ.get("KILN_TEST_WORKERS", "2")
    markers = os.environ.get("KILN_TEST_MARKERS", "not gpu")
    chosen = os.environ.get("KILN_TEST_ROOTS")
    roots = [r.strip() for r in chosen.split(",") if r.strip()] if chosen else ROOTS
    unknown = sorted(set(roots) - set(ROOTS))
    if unknown:
        print(f"KILN_TEST_ROOTS names no test root: {', '.join(unknown)} (roots: {', '.join(ROOTS)})")
        return 2
    passed = failed = skipped = 0
    bad: list[str] = []
    seconds: dict[str, float] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(TOOLS), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory() as tmp:
        for i, root in enumerate(roots):
            junit = Path(tmp) / f"{i}.xml"
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "pytest", root, "-q", "-n", workers, "-m", markers,
                   "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "pytest_order",
                   "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit1", *argv]
            rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
            seconds.update(_file_seconds(junit))
            p, f, s = _counts(junit)
            if rc not in (0, 5) and f == 0:
                f = 1  # pytest failed without reporting a test failure (collection, crash)
            passed, failed, skipped = passed + p, failed + f, skipped + s
            if f:
                bad.append(root)
            print(f"[{root}] {p} passed, {f} failed, {s} skipped in {time.perf_counter() - t0:.0f}s",
                  flush=True)
            print("  slowest: " + "; ".join(f"{t:.0f}s {name}" for t, name in _slowest(junit)), flush=True)
    if record:
        _record(seconds, roots)
    if bad:
        print("failing test roots: " + ", ".join(bad))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
