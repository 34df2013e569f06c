"""The graph cache keys a symbolic graph on its symbolic signature: a later process (here: a second
kiln.compile) capturing the same graph at another size loads it instead of compiling, and serves
every size from it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sympy
import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import kiln
import kiln.capture as kc
import kiln.runtime.cache as runtime_cache
from kiln.capture.shape_source import KilnSource
from kiln.runtime import CompileCache
from kiln.runtime import graph_cache as gc


@pytest.fixture
def local_cache(tmp_path: Path) -> Iterator[CompileCache]:
    """A compile cache of this test's own, the process's default while the test runs."""
    with runtime_cache.using_cache(CompileCache(tmp_path)) as store:
        yield store


def test_symbolic_graph_hit_at_another_size(local_cache: CompileCache) -> None:
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    before = kiln.stats()
    first = kiln.compile(net, backend="aot_eager", dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 8, requires_grad=True)
        torch.testing.assert_close(first(x), net(x))
    compiled = kiln.stats() - before
    assert (compiled.cache_misses, compiled.cache_hits) == (1, 0)  # one symbolic graph for both sizes
    second = kiln.compile(net, backend="aot_eager", dynamic=True)  # what a restarted process does
    for n in (9, 13, 2, 30):
        x = torch.randn(n, 8, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        out, ref = second(x), net(y)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
    loaded = kiln.stats() - before
    assert (loaded.cache_misses, loaded.cache_hits) == (1, 1), "the symbolic graph was compiled again instead of loaded"
    assert len(kc.cache_entries(second._compiled_forward)) == 1


# ---- guards a compile adds travel with the entry ---------------------------------------------------

_CHILD = r'''
import json, sys
import torch
from torch import nn
import kiln
import kiln.capture as kc
import kiln.runtime.cache as runtime_cache
from kiln.runtime import CompileCache

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.cumprod(torch.tanh(self.a(x)), dim=0))


torch.manual_seed(0)
net = Net()
with runtime_cache.using_cache(CompileCache(sys.argv[1])):
    f = kiln.compile(net, backend="aot_eager", dynamic=True)
    sizes = [int(n) for n in sys.argv[2].split(",")]
    compiles = []
    for n in sizes:
        before = kiln.stats()
        x = torch.randn(n, 8, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        out, ref = f(x), net(y)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
        d = kiln.stats() - before
        compiles.append([d.cache_hits, d.cache_misses])
    guards = [[g.as_text() for g in e.guards if g.kind == "SHAPE_EXPR"]
              for e in kc.cache_entries(f._compiled_forward)]
print(json.dumps({"compiles": compiles, "guards": guards}))
'''


def _child(cache_dir: Path, sizes: str) -> dict:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(cache_dir), sizes], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_compile_guard_travels_with_the_entry(tmp_path: Path) -> None:
    """Compiling the symbolic training graph adds a guard: cumprod's backward formula (ATen's C++)
    reads the length as an int, so each graph is compiled for one length (``s == 5``). The entry
    records it; a second process loads the entry when its call passes that guard instead of
    compiling, and compiles a length it fails; every call matches eager's outputs and gradients.
    (torch.compile's AOTAutograd runs the same C++ formula.)"""
    first = _child(tmp_path, "5,7")
    assert first["compiles"] == [[0, 1], [0, 1]]
    assert [any(f"== {n})" in g for g in guards) for n, guards in zip((5, 7), first["guards"], strict=True)] \
        == [True, True], first["guards"]
    second = _child(tmp_path, "7,6")
    # 7: the stored entry (the last one compiled), loaded, its recorded guard passed and added to the
    # capture entry; 6: the same symbolic graph, but the entry's guard fails: compiled
    assert second["compiles"] == [[1, 0], [0, 1]], second
    assert any("== 7)" in g for g in second["guards"][0]), second["guards"]


def test_recorded_guard_the_caller_fails_is_a_miss() -> None:
    """An entry compiled under ``s0 > 4`` does not serve a graph captured at size 3: nothing is
    added to the caller's ShapeEnv and the reason names the guard."""
    def env_at(n: int) -> tuple[ShapeEnv, sympy.Symbol]:
        env = ShapeEnv()
        sym = env.create_symbol(n, KilnSource("L['x'].size()[0]"), dynamic_dim=DimDynamic.DYNAMIC)
        return env, sym
    env, s = env_at(7)
    text = sympy.srepr(sympy.Gt(s, 4))
    assert gc.replay_guards(env, [text], None) is None
    assert [str(g.expr) for g in env.guards] == [str(sympy.Gt(s, 4))]
    other, _ = env_at(3)
    why = gc.replay_guards(other, [text], None)
    assert why is not None and "> 4" in why, why
    assert not other.guards
    unknown = sympy.srepr(sympy.Gt(sympy.Symbol("s99", integer=True, positive=True), 4))
    assert "s99" in (gc.replay_guards(other, [unknown], None) or "")
