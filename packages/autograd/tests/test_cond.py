"""torch.cond nodes (``torch.ops.higher_order.cond(pred, true_gm, false_gm, operands)``, branches as
submodules) traced into functional ATen with ``where``; graphs are built by hand as kiln.capture
builds them. Eager reference: the same GraphModule run by torch with real tensors."""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest
import torch
from ag_util import check, compile_fn  # type: ignore[import-not-found]
from torch import fx, nn

from kiln.autograd import AutogradTraceError, partition, trace_joint

aten = torch.ops.aten
COND = torch.ops.higher_order.cond


def cond_graph(true_fn: Callable[..., tuple[torch.Tensor, ...]],
               false_fn: Callable[..., tuple[torch.Tensor, ...]], n_operands: int, n_outputs: int,
               post: Callable[[fx.Graph, list[fx.Node]], list[fx.Node]] | None = None) -> fx.GraphModule:
    """``(pred, *operands) -> cond outputs`` (optionally post-processed by ``post``)."""
    root = nn.Module()
    root.true_graph_0 = fx.symbolic_trace(true_fn)
    root.false_graph_0 = fx.symbolic_trace(false_fn)
    g = fx.Graph()
    pred = g.placeholder("pred")
    ops = [g.placeholder(f"x{i}") for i in range(n_operands)]
    t, f = g.get_attr("true_graph_0"), g.get_attr("false_graph_0")
    c = g.call_function(COND, (pred, t, f, tuple(ops)))
    outs = [g.call_function(operator.getitem, (c, i)) for i in range(n_outputs)]
    if post is not None:
        outs = post(g, outs)
    g.output(tuple(outs))
    return fx.GraphModule(root, g)


def _true(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.sin(x) * w, (x @ w).relu())


def _false(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.cos(x) + w, x @ w.t())


@pytest.mark.parametrize("taken", [True, False])
def test_cond_grads_match_eager(taken: bool) -> None:
    gm = cond_graph(_true, _false, 2, 2)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    compiled = check(gm, [torch.tensor(taken), x, w])
    fw = compiled.texts["aot_forward"]
    assert "aten.where" in fw and "cond" not in fw


def test_cond_predicate_from_the_graph() -> None:
    # pred computed inside the graph from an input, as capture emits for `if x.sum() > 0`
    root = nn.Module()
    root.true_graph_0 = fx.symbolic_trace(lambda x, w: (x * w,))
    root.false_graph_0 = fx.symbolic_trace(lambda x, w: (x - w,))
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    s = g.call_function(torch.sum, (x,))
    pred = g.call_function(operator.gt, (s, 0))
    c = g.call_function(COND, (pred, g.get_attr("true_graph_0"), g.get_attr("false_graph_0"), (x, w)))
    g.output((g.call_function(operator.getitem, (c, 0)),))
    gm = fx.GraphModule(root, g)
    w = torch.randn(3, requires_grad=True)
    for x in (torch.ones(3), -torch.ones(3)):
        check(gm, [x, w])


def test_cond_python_bool_traces_one_branch() -> None:
    gm = cond_graph(_true, _false, 2, 2)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    compiled = check(gm, [False, x, w])
    assert "aten.where" not in compiled.texts["aot_forward"]
    assert "aten.cos" in compiled.texts["aot_forward"]


def test_cond_inference() -> None:
    gm = cond_graph(_true, _false, 2, 2)
    check(gm, [torch.tensor(True), torch.randn(4, 4), torch.randn(4, 4)], no_grad=True)


def test_cond_single_element_float_predicate() -> None:
    gm = cond_graph(lambda x: (x * 2,), lambda x: (x + 2,), 1, 1)
    x = torch.randn(5, requires_grad=True)
    for p in (torch.tensor([True]), torch.tensor([False])):
        check(gm, [p, x])


def test_nested_cond() -> None:
    inner = cond_graph(lambda x, w: (x * w,), lambda x, w: (x + w,), 2, 1)

    def outer_true(p: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (x.exp(),)

    root = nn.Module()
    root.true_graph_0 = fx.symbolic_trace(outer_true)
    root.false_graph_0 = inner
    g = fx.Graph()
    p1, p2, x, w = (g.placeholder(n) for n in ("p1", "p2", "x", "w"))
    c = g.call_function(COND, (p1, g.get_attr("true_graph_0"), g.get_attr("false_graph_0"), (p2, x, w)))
    g.output((g.call_function(operator.getitem, (c, 0)),))
    gm = fx.GraphModule(root, g)
    w = torch.randn(3, requires_grad=True)
    for a in (True, False):
        for b in (True, False):
            check(gm, [torch.tensor(a), torch.tensor(b), torch.randn(3), w])


def test_cond_branch_with_constant_and_partition() -> None:
    class WithConst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (torch.tanh(x) * self.scale,)

    root = nn.Module()
    root.true_graph_0 = fx.symbolic_trace(WithConst())
    root.false_graph_0 = fx.symbolic_trace(lambda x: (torch.sigmoid(x),))
    g = fx.Graph()
    p, x = g.placeholder("p"), g.placeholder("x")
    c = g.call_function(COND, (p, g.get_attr("true_graph_0"), g.get_attr("false_graph_0"), (x,)))
    g.output((g.call_function(operator.getitem, (c, 0)),))
    gm = fx.GraphModule(root, g)
    x = torch.randn(3, requires_grad=True)
    compiled = compile_fn(gm, [torch.tensor(True), x])
    scale = torch.tensor([1.0, 2.0, 3.0])
    for pred in (True, False):  # torch's eager cond refuses branches reading tensors: reference by hand
        xc, xe = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        (out,) = compiled(torch.tensor(pred), xc)
        ref = torch.tanh(xe) * scale if pred else torch.sigmoid(xe)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
    joint = trace_joint(gm, [torch.tensor(True), x])
    parts = partition(joint, "min_cut")
    assert parts.saved_bytes <= partition(joint, "save_all").saved_bytes


def test_cond_shape_mismatch_names_the_node() -> None:
    gm = cond_graph(lambda x: (x.sum(0),), lambda x: (x,), 1, 1)
    with pytest.raises(AutogradTraceError, match=r"torch.cond node 'cond'.*output 0 differs"):
        compile_fn(gm, [torch.tensor(True), torch.randn(3, 3, requires_grad=True)])


def test_cond_dtype_mismatch_is_an_error() -> None:
    gm = cond_graph(lambda x: (x.double(),), lambda x: (x,), 1, 1)
    with pytest.raises(AutogradTraceError, match="differs between the branches"):
        compile_fn(gm, [torch.tensor(True), torch.randn(3)])


def test_cond_structure_mismatch_is_an_error() -> None:
    gm = cond_graph(lambda x: (x, x + 1), lambda x: (x,), 1, 1)
    with pytest.raises(AutogradTraceError, match="different structures"):
        compile_fn(gm, [torch.tensor(True), torch.randn(3)])


def test_cond_branch_mutating_an_input_is_an_error() -> None:
    def mutating(x: torch.Tensor) -> tuple[torch.Tensor]:
        x.add_(1)
        return (x * 2,)
    gm = cond_graph(mutating, lambda x: (x * 3,), 1, 1)
    with pytest.raises(AutogradTraceError, match="true branch mutates"):
        compile_fn(gm, [torch.tensor(True), torch.randn(3)])


def test_cond_multi_element_predicate_is_an_error() -> None:
    gm = cond_graph(lambda x: (x,), lambda x: (-x,), 1, 1)
    with pytest.raises(AutogradTraceError, match="predicate has shape"):
        compile_fn(gm, [torch.tensor([True, False]), torch.randn(3)])


def test_cond_captured_by_dynamo_trains() -> None:
    # the same node format from a real front end (dynamo; kiln.capture emits it too): parameters are
    # lifted into the operands, both predicate values reuse one compiled graph
    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: self.lin(x) * 2, (x,))

    torch.manual_seed(0)
    model = Gated()
    graphs = []

    def backend(gm: fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        assert any(n.target is COND for n in gm.graph.nodes)
        graphs.append(compile_fn(gm, example_inputs))
        return graphs[-1]

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    for sign in (1.0, -1.0):
        x = sign * torch.rand(3, 4)
        model.zero_grad()
        model(x).sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        out = compiled(x)
        out.sum().backward()
        torch.testing.assert_close(out, model(x))
        for p, g in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, g)
    assert len(graphs) == 1 and "aten.where" in graphs[0].texts["aot_forward"]
