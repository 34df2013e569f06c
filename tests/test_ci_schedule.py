"""CI's test schedule (tools/run_tests.py, tools/pytest_order.py): longest files first, every test kept."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"kiln_ci_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_longest_files_first_and_each_file_kept_in_order() -> None:
    order = _tool("pytest_order").order
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "new.py::t1", "b.py::t2", "new.py::t2"]
    got = [ids[i] for i in order(ids, {"a.py": 5.0, "b.py": 40.0, "c.py": 12.0})]
    assert got == ["b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2", "new.py::t1", "new.py::t2"]
    assert sorted(got) == sorted(ids)  # a schedule, never a selection


def test_a_missing_or_broken_table_keeps_the_collection_order(tmp_path: Path) -> None:
    tool = _tool("pytest_order")
    assert tool.load_durations(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert tool.load_durations(tmp_path / "bad.json") == {}
    ids = ["b.py::t", "a.py::t"]
    assert tool.order(ids, {}) == [0, 1]


def test_the_committed_table_names_test_files_that_exist() -> None:
    """A renamed or deleted file would silently lose its place: the table is refreshed with
    ``python tools/run_tests.py --record-durations``."""
    table = json.loads((ROOT / "tools" / "test_durations.json").read_text())
    assert table and all(isinstance(t, float | int) and t >= 0 for t in table.values())
    missing = [f for f in table if not (ROOT / f).is_file()]
    assert not missing, f"tools/test_durations.json names files that do not exist: {missing}"


def test_seconds_per_file_from_a_junit_report(tmp_path: Path) -> None:
    junit = tmp_path / "r.xml"
    junit.write_text('<testsuites><testsuite tests="3">'
                     '<testcase file="tests/a.py" classname="tests.a" name="t1" time="1.5"/>'
                     '<testcase file="tests/a.py" classname="tests.a" name="t2" time="2.0"/>'
                     '<testcase file="tests/b.py" classname="tests.b" name="t" time="0.25"/>'
                     '</testsuite></testsuites>')
    assert _tool("run_tests")._file_seconds(junit) == {"tests/a.py": 3.5, "tests/b.py": 0.25}
