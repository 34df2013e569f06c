"""kiln.autograd on graphs with symbolic sizes (placeholders whose meta["val"] are FakeTensors over one
ShapeEnv, as kiln.capture makes them): joint tracing, functionalization, partitioning with saved
sizes, inference graphs, and the contract the compiler callbacks rely on (kiln.graph.symbolic's Note).
Each compiled graph is then run with real tensors of several sizes and compared with eager."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from ag_util import assert_close, clone_inputs
from torch import fx
from torch._dynamo.source import ConstantSource  # tests only: a named source for the symbols
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import kiln.autograd as ka


def symbolic_graph(fn: Callable[..., Any], inputs: Sequence[Any], dynamic: Sequence[Sequence[int]]) -> fx.GraphModule:
    """``fn`` traced by fx, its placeholders' vals fakes whose dims in ``dynamic[i]`` are symbolic
    (ints in ``inputs`` become SymInt placeholders), all over one ShapeEnv."""
    gm = fx.symbolic_trace(fn)
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (n, x, dims) in enumerate(zip(phs, inputs, dynamic)):
        src = ConstantSource(f"in{i}")
        if isinstance(x, int):
            sym = env.create_symbol(x, src, dynamic_dim=DimDynamic.DYNAMIC)
            n.meta["val"] = env.create_symintnode(sym, hint=x, source=src)
            continue
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
                                                      for d in range(x.dim())])
        fake = mode.from_tensor(x, source=src, symbolic_context=ctx)
        n.meta["val"] = fake
    return gm


class ContractCompiler:
    """A compiler callback that checks the symbolic-graph contract, then runs the ATen graph; at run
    time it checks it gets real tensors and plain ints."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        assert list(example_inputs) == vals or all(a is b for a, b in zip(example_inputs, vals))
        envs = {id(s.node.shape_env) for v in vals for s in (v.shape if isinstance(v, torch.Tensor) else [v])
                if isinstance(s, torch.SymInt)}
        assert len(envs) <= 1, "more than one ShapeEnv"
        for v in vals:
            assert isinstance(v, (FakeTensor, torch.SymInt)), type(v)
        for n in gm.graph.nodes:
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.SymInt):
                assert n.target in (torch.ops.aten.sym_size.int, operator.add, operator.mul, operator.floordiv,
                                    operator.mod, operator.pow, torch.sym_max, torch.sym_min), n.target
        self.graphs.append(gm)

        def run(*args: Any) -> Any:
            for a in args:
                assert type(a) is int or (isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor)), type(a)
            return gm(*args)
        return run


def check_symbolic(fn: Callable[..., Any], make: Callable[[int], list[Any]], dynamic: Sequence[Sequence[int]],
                   sizes: Sequence[int], grad: bool = True) -> ContractCompiler:
    first = make(sizes[0])
    gm = symbolic_graph(fn, first, dynamic)
    comp = ContractCompiler()
    with torch.set_grad_enabled(grad):
        compiled = ka.aot(gm, first, fw_compiler=comp)
    for n in [*sizes, *sizes]:
        torch.manual_seed(n)
        inputs = make(n)
        e_in, c_in = clone_inputs(inputs), clone_inputs(inputs)
        with torch.set_grad_enabled(grad):
            e_out, c_out = fn(*e_in), compiled(*c_in)
        assert_close(c_out, e_out, what=f"size {n}")
        if grad:
            g = torch.randn(e_out.shape)
            e_out.backward(g)
            c_out.backward(g)
            for a, b in zip(c_in, e_in):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    assert_close(a.grad, b.grad, what=f"grad at size {n}")
    return comp


def mlp_view(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w)
    return h.view(h.shape[0], -1, 2).sum(1) * 2


def test_joint_graph_saves_sizes_as_ints() -> None:
    comp = check_symbolic(mlp_view, lambda n: [torch.randn(n, 8, requires_grad=True), torch.randn(8, 6, requires_grad=True)],
                          [[0], []], [3, 5, 11])
    fw, bw = comp.graphs
    bw_ints = [n for n in bw.graph.nodes if n.op == "placeholder" and isinstance(n.meta["val"], torch.SymInt)]
    assert bw_ints, "the backward reads the batch size: saved as an int"
    fw_out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    assert isinstance(fw_out[-1].meta["val"], torch.SymInt)  # saved sizes come last


def test_inference_graph_and_symbolic_int_input() -> None:
    def f(x: torch.Tensor, k: int) -> torch.Tensor:
        return x[:k].reshape(k, -1).softmax(-1) * k
    comp = ContractCompiler()
    x = torch.randn(9, 4)
    gm = symbolic_graph(f, [x, 5], [[0], []])
    with torch.no_grad():
        compiled = ka.aot(gm, [x, 5], fw_compiler=comp)
        for n, k in [(9, 5), (12, 7), (7, 2), (30, 29)]:
            x = torch.randn(n, 4)
            assert_close(compiled(x, k), f(x, k), what=f"n={n} k={k}")
    (graph,) = comp.graphs
    assert any(isinstance(n.meta["val"], torch.SymInt) for n in graph.graph.nodes if n.op == "placeholder")


def test_functionalized_mutation_of_a_symbolic_input() -> None:
    def f(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        buf[: x.shape[0]].add_(x)
        return buf.sum(0)

    def make(n: int) -> list[Any]:
        return [torch.zeros(n + 2, 3), torch.randn(n, 3)]
    check_symbolic(f, make, [[0], [0]], [2, 4, 9], grad=False)


def test_layer_norm_and_cross_entropy_backward() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.layer_norm(x, (6,), w)
        return torch.nn.functional.cross_entropy(h.flatten(0, 1), t.flatten(), reduction="none").view(x.shape[:2])

    def make(n: int) -> list[Any]:
        return [torch.randn(n, n + 1, 6, requires_grad=True), torch.randn(6, requires_grad=True),
                torch.randint(0, 6, (n, n + 1))]
    check_symbolic(f, make, [[0, 1], [], [0, 1]], [2, 3, 7])


def test_min_cut_uses_size_hints() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin().cos()
    x = torch.randn(64, 8, requires_grad=True)
    gm = symbolic_graph(f, [x], [[0]])
    joint = ka.trace_joint(gm, [x])
    parts = ka.partition(joint, "min_cut")
    assert parts.saved_bytes == 64 * 8 * 4  # the input itself, at its hint: recompute sin in the backward
