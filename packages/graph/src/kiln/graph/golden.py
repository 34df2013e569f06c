"""Golden pass tests: one text file per case holds a pass's input program and the output expected of it.

The pass tests of TVM and MLIR work this way: a reader sees what a pass does from the file alone, and
a change to the pass shows up as a diff of the expected part. A file reads::

    # golden: <what the pass is> (comment lines up to the first blank line; kept when rewritten)

    <the input program>
    # ---- expected ----
    <the output program>

``check_golden`` compares a pass's output with the expected part. With ``update`` (pytest's
``--update-golden`` or ``KILN_UPDATE_GOLDEN=1`` in the packages' test suites) it writes the file
instead — the expected part, and the input part when the file is new or ``input`` is given — and the
diff is then reviewed like code. A missing file without ``update`` fails: a test never writes the
answer it checks.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .knobs import KNOBS

SEPARATOR = "# ---- expected ----"


@dataclass(frozen=True)
class GoldenFile:
    header: str  # the leading comment lines, up to the first blank line
    input: str
    expected: str

    def as_text(self) -> str:
        return f"{self.header}\n\n{self.input.strip()}\n{SEPARATOR}\n{self.expected.rstrip()}\n"


def read_golden(path: Path) -> GoldenFile:
    text = path.read_text()
    if SEPARATOR not in text:
        raise ValueError(f"{path}: a golden file has an input part, then {SEPARATOR!r}, then the expected part")
    head, _, expected = text.partition(SEPARATOR + "\n")
    header, blank, source = head.partition("\n\n")
    if not blank or not header.startswith("#"):
        raise ValueError(f"{path}: a golden file starts with comment lines, then a blank line, then the input")
    return GoldenFile(header, source.strip(), expected.rstrip())


def check_golden(path: Path, run: Callable[[str], str], *, describe: str, update: bool,
                 input: str | None = None) -> None:
    """Run the pass (``run(input) -> output``) on the file's input and compare with its expected part.

    ``input``: the input as the test makes it now (e.g. a freshly traced graph). A new file takes it;
    for an existing file it must equal the stored input (so a changed front end shows as an input diff),
    and ``update`` rewrites the stored one.
    """
    if not path.exists():
        if not update or input is None:
            raise AssertionError(f"{path} does not exist: run the test with --update-golden (or "
                                 "KILN_UPDATE_GOLDEN=1) to write it, then review it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(GoldenFile(f"# golden: {describe}", input, run(input)).as_text())
        return
    golden = read_golden(path)
    source = golden.input
    if input is not None and input.rstrip() != source:
        if not update:
            raise AssertionError(f"{path}: the input changed (--update-golden rewrites it):\n"
                                 + _diff(source, input, "stored input", "input now"))
        source = input.rstrip()
    actual = run(source).rstrip()
    if update:
        path.write_text(GoldenFile(golden.header, source, actual).as_text())
        return
    if actual != golden.expected:
        raise AssertionError(f"{path}: the pass's output differs from the expected part "
                             "(--update-golden rewrites it; review the diff):\n"
                             + _diff(golden.expected, actual, "expected", "actual"))


def _diff(a: str, b: str, name_a: str, name_b: str) -> str:
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, lineterm=""))


def add_update_golden_option(parser: Any) -> None:
    """Register pytest's ``--update-golden`` (default from ``KILN_UPDATE_GOLDEN``) once, from any test
    root's ``pytest_addoption``: one pytest over every root meets it in each package's conftest."""
    try:
        parser.addoption("--update-golden", action="store_true", default=KNOBS.update_golden,
                         help="rewrite golden files (tests/golden/*.txt) instead of comparing; review the diff")
    except ValueError:  # already added by another package's conftest
        pass
