"""Code objects and guard checks reused from the compile cache: same behaviour, bad entries ignored."""

from __future__ import annotations

from pathlib import Path

import torch

from kiln.graph import Guard, GuardSet, tensor_expectation
from kiln.runtime import CompileCache
from kiln.runtime.fast_load import _CODE_NS, compile_cached, compile_guards


def _guards() -> GuardSet:
    x = torch.randn(2, 3)
    return GuardSet((
        Guard("L['x']", "TENSOR_MATCH", tensor_expectation(x)),
        Guard("L['n']", "EQUALS_MATCH", 3),
        Guard("L['m']", "TYPE_MATCH", "torch.nn.modules.linear:Linear"),
        Guard("L['m'].weight", "TENSOR_MATCH", tensor_expectation(torch.nn.Linear(3, 3).weight)),
    ))


def _frames() -> tuple[dict, dict]:
    good = {"x": torch.randn(2, 3), "n": 3, "m": torch.nn.Linear(3, 3)}
    bad = [dict(good, x=torch.randn(3, 3)), dict(good, n=4), dict(good, n=3.0),
           dict(good, m=torch.nn.Linear(3, 4)), dict(good, x=torch.randn(2, 3, dtype=torch.float64))]
    return good, bad


def test_guard_check_and_gather() -> None:
    outs = ["L['x']", "L['m'].weight", "L['m'].bias"]
    good, bad = _frames()
    check, gather = compile_guards(_guards()), compile_guards(_guards(), outs)
    assert check(good, {}) is True and [check(b, {}) for b in bad] == [False] * len(bad)
    got = gather(good, {})
    assert got is not None and got[0] is good["x"] and got[1] is good["m"].weight
    assert got[2] is good["m"].bias
    assert [gather(b, {}) for b in bad] == [None] * len(bad)
    assert gather({"x": good["x"], "n": 3}, {}) is None  # a source that cannot be read fails


def test_corrupt_code_entries_are_regenerated(tmp_path: Path) -> None:
    store = CompileCache(tmp_path)
    compile_cached("y = 1 + 1\n", "<t>", store)
    for p in (tmp_path / "v1" / "entries" / _CODE_NS).rglob("*"):
        if p.is_file():
            p.write_bytes(p.read_bytes()[:-5])
    ns: dict = {}
    exec(compile_cached("y = 1 + 1\n", "<t>", store), ns)
    assert ns["y"] == 2


def test_compile_cached_reuses_code(tmp_path: Path) -> None:
    store = CompileCache(tmp_path)
    src = "def f(a):\n    return a * 2\n"
    a, b = compile_cached(src, "<f>", store), compile_cached(src, "<f>", store)
    assert a is not b and a == b  # the second one was unmarshalled
    ns: dict = {}
    exec(b, ns)
    assert ns["f"](4) == 8
