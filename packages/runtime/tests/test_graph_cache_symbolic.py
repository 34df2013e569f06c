"""Graph-cache keys of symbolic graphs: the symbolic signature (not the example sizes) is the key, and
a compile that added shape guards is not stored (a hit would not add them to the caller's guards)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import fx
from torch._dynamo.source import ConstantSource  # tests only: a named source for the symbol
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.graph import CompiledGraph, PortableProgram
from kiln.runtime import CompileCache, cached_backend, graph_key


def _graph(n: int) -> tuple[fx.GraphModule, torch.Tensor]:
    gm = fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(n, 3)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    ph = next(iter(gm.graph.nodes))
    ph.meta["val"] = mode.from_tensor(x, source=ConstantSource("x"), symbolic_context=ctx)
    return gm, x


_PROGRAM = PortableProgram("def call(args):\n    return (args[0] * 2,)\n")


def test_key_is_the_symbolic_signature() -> None:
    (a, xa), (b, xb) = _graph(5), _graph(9)
    assert graph_key(a, [xa], backend="b", options=()) == graph_key(b, [xb], backend="b", options=())
    static = fx.symbolic_trace(lambda x: x * 2)
    assert graph_key(static, [torch.randn(5, 3)], backend="b", options=()) != \
        graph_key(static, [torch.randn(9, 3)], backend="b", options=())


def test_a_compile_that_adds_guards_is_not_stored(tmp_path: Path) -> None:
    calls: list[int] = []

    def specialising(gm: fx.GraphModule, example_inputs: list) -> CompiledGraph:
        calls.append(1)
        int(next(iter(gm.graph.nodes)).meta["val"].shape[0])  # adds the guard s0 == hint
        return CompiledGraph(lambda x: (x * 2,), "test", {}, _PROGRAM)

    def clean(gm: fx.GraphModule, example_inputs: list) -> CompiledGraph:
        calls.append(1)
        return CompiledGraph(lambda x: (x * 2,), "test", {}, _PROGRAM)

    cache = CompileCache(tmp_path)
    for backend, expected_calls in ((specialising, 2), (clean, 1)):
        calls.clear()
        wrapped = cached_backend(backend, backend.__name__, (), cache=cache)
        for n in (5, 9):
            gm, x = _graph(n)
            torch.testing.assert_close(wrapped(gm, [x])(x)[0], x * 2)
        assert len(calls) == expected_calls, backend.__name__


def _float_graph(value: float) -> tuple[fx.GraphModule, list[object]]:
    gm = fx.symbolic_trace(lambda x, f: x * f)
    env = ShapeEnv()
    sym = env.create_unspecified_symbol(value, ConstantSource("f"), dynamic_dim=DimDynamic.DYNAMIC)
    mode = FakeTensorMode(shape_env=env)
    x = torch.randn(4, 3)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ph[0].meta["val"] = mode.from_tensor(x, static_shapes=True)
    ph[1].meta["val"] = env.create_symfloatnode(sym, hint=value, source=ConstantSource("f"))
    return gm, [x, value]


def test_a_float_argument_is_keyed_by_its_symbol_not_its_value() -> None:
    """A float lifted to a graph input (a learning rate) compiles once for every value: its value is not
    in the key (a different value would miss and compile again)."""
    (a, ia), (b, ib) = _float_graph(0.5), _float_graph(0.125)
    assert graph_key(a, ia, backend="b", options=()) == graph_key(b, ib, backend="b", options=())
