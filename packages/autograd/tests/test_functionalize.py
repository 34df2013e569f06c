"""Golden checks on the functionalized graphs: no mutation survives, scatters write views back."""

from __future__ import annotations

import pytest
import torch
from ag_util import compile_module  # type: ignore[import-not-found]
from torch import fx

from kiln.autograd import AutogradTraceError, ops, trace_inference, trace_joint
from kiln.graph import verify

aten = torch.ops.aten


def _targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("view, scatter", [
    (lambda h: h[1:3], "aten.slice_scatter.default"),
    (lambda h: h[2], "aten.select_scatter.default"),
    (lambda h: h.diagonal(), "aten.diagonal_scatter.default"),
    (lambda h: h.as_strided((2, 2), (1, 4)), "aten.as_strided_scatter.default"),
    (lambda h: h.unbind(1)[0], "aten.select_scatter.default"),
    (lambda h: h.split(2)[1], "aten.slice_scatter.default"),
])
def test_view_mutation_becomes_scatter(view, scatter) -> None:  # type: ignore[no-untyped-def]
    def f(x):  # type: ignore[no-untyped-def]
        h = x * 2
        view(h).add_(1)
        return (h,)
    g = trace_inference(fx.symbolic_trace(f), [torch.randn(4, 4)])
    verify(g.gm, "aten")
    assert scatter in _targets(g.gm)
    x = torch.randn(4, 4)
    torch.testing.assert_close(g.gm(x)[0], f(x)[0])


def test_input_mutation_is_extra_output() -> None:
    def f(x, y):  # type: ignore[no-untyped-def]
        x.mul_(2)
        y[0].zero_()
        return (x + y,)
    g = trace_inference(fx.symbolic_trace(f), [torch.randn(3, 3), torch.randn(3, 3)])
    assert g.signature.mutated_inputs == (0, 1)
    assert len(list(g.gm.graph.nodes)[-1].args[0]) == 3


def test_no_inplace_ops_remain() -> None:
    def f(x, w):  # type: ignore[no-untyped-def]
        h = x @ w + 1
        h[:, 0].copy_(torch.ones(3))
        h.mul_(2.0)
        h.sigmoid_()
        return (h.sum(),)
    g = trace_joint(fx.symbolic_trace(f), [torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)])
    verify(g.gm, "aten")
    for n in g.gm.graph.nodes:
        if isinstance(n.target, torch._ops.OpOverload):
            assert not ops.mutated_args(n.target), n.target


def test_out_variant_inference() -> None:
    def f(x, y):  # type: ignore[no-untyped-def]
        torch.add(x, 1, out=y)
        torch.mul(x, y, out=x)
        return (x + y,)
    x, y = torch.randn(3), torch.zeros(3)
    g = trace_inference(fx.symbolic_trace(f), [x, y])
    assert g.signature.mutated_inputs == (0, 1)
    xe, ye = x.clone(), y.clone()
    ref = f(xe, ye)
    out = g.gm(x.clone(), y.clone())
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], xe)
    torch.testing.assert_close(out[2], ye)


def test_index_put_on_input() -> None:
    def f(x, idx, v):  # type: ignore[no-untyped-def]
        x.index_put_((idx,), v, accumulate=True)
        return (x * 2,)
    x, idx, v = torch.zeros(5), torch.tensor([0, 2, 2]), torch.ones(3)
    g = trace_inference(fx.symbolic_trace(f), [x, idx, v])
    assert "aten.index_put.default" in _targets(g.gm)
    out = g.gm(x.clone(), idx, v)
    xe = x.clone()
    f(xe, idx, v)
    torch.testing.assert_close(out[1], xe)


def test_mutating_grad_requiring_input_is_a_clear_error() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        y = x.view(-1)
        return (y,)
    # leaf inputs that require grad cannot be mutated in eager either; a clean trace is still fine
    trace_joint(fx.symbolic_trace(f), [torch.randn(3, requires_grad=True)])

    with pytest.raises(AutogradTraceError, match="mutated in place"):
        trace_joint(fx.symbolic_trace(_bump_then_double), [torch.randn(3, requires_grad=True)])


@fx.wrap
def _bump(x):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        x.add_(1)
    return x


def _bump_then_double(x):  # type: ignore[no-untyped-def]
    return (_bump(x) * 2,)


@fx.wrap
def _scale_by_item(x):  # type: ignore[no-untyped-def]
    return x * x.sum().item()


def test_item_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="item|data-dependent|DataDependent"):
        trace_inference(fx.symbolic_trace(lambda x: (_scale_by_item(x),)), [torch.randn(3)])


@pytest.mark.parametrize("op, functional", [
    (aten.add_.Tensor, aten.add.Tensor), (aten.bernoulli_.float, aten.bernoulli.p),
    (aten.normal_.default, aten.normal_functional.default), (aten.index_put_.default, aten.index_put.default),
    (aten.copy_.default, aten.copy.default), (aten.add.out, aten.add.Tensor), (aten.zero_.default, aten.zero.default),
])
def test_functional_variant_lookup(op, functional) -> None:  # type: ignore[no-untyped-def]
    m = ops.mutation_of(op)
    assert m is not None and m.functional is functional


def test_inplace_view_op_on_intermediate() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        h = x + 1
        h.unsqueeze_(0)
        h.t_()
        return (h * 2,)
    x = torch.randn(3)
    g = trace_inference(fx.symbolic_trace(f), [x])
    torch.testing.assert_close(g.gm(x)[0], f(x.clone())[0])


def test_batchnorm_running_stats_functional() -> None:
    bn = torch.nn.BatchNorm1d(3)
    compiled, graphs = compile_module(bn)
    x = torch.randn(4, 3)
    compiled(x)
    assert "aten._native_batch_norm_legit_functional.default" in graphs[0].texts["aot_forward"]
    ref = torch.nn.BatchNorm1d(3)
    ref(x)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert bn.num_batches_tracked.item() == 1
