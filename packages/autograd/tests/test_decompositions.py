"""Decompositions applied during tracing: a table entry replaces the op, its aten calls are traced."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ag_util import check  # type: ignore[import-not-found]
from torch import fx

from kiln.autograd import aot_eager, trace_joint

aten = torch.ops.aten


def _gelu(x, approximate="none"):  # type: ignore[no-untyped-def]
    return aten.mul.Tensor(aten.mul.Tensor(x, 0.5), aten.add.Tensor(aten.erf.default(aten.mul.Tensor(x, 0.7071067811865476)), 1))


def _relu(x):  # type: ignore[no-untyped-def]
    return aten.clamp_min.default(x, 0)


def _threshold_backward(grad, out, threshold):  # type: ignore[no-untyped-def]
    return aten.where.self(aten.le.Scalar(out, threshold), aten.zeros_like.default(grad), grad)


def _addmm(bias, a, b, beta=1, alpha=1):  # type: ignore[no-untyped-def]
    return aten.add.Tensor(aten.mm.default(a, b), bias)


TABLE = {aten.gelu.default: _gelu, aten.relu.default: _relu,
         aten.threshold_backward.default: _threshold_backward, aten.addmm.default: _addmm}


def _targets(gm: fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_decomposed_ops_leave_the_graph() -> None:
    def f(x, w):  # type: ignore[no-untyped-def]
        return (torch.relu(F.gelu(x @ w)).sum(),)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    joint = trace_joint(fx.symbolic_trace(f), [x, w], decompositions=TABLE)
    t = _targets(joint.gm)
    assert "aten.gelu.default" not in t and "aten.relu.default" not in t
    assert "aten.erf.default" in t and "aten.clamp_min.default" in t


def test_decomposed_training_matches_eager() -> None:
    lin = torch.nn.Linear(4, 4)
    gm = fx.symbolic_trace(torch.nn.Sequential(lin, torch.nn.ReLU()))
    c = aot_eager(gm, [torch.randn(2, 4)], decompositions=TABLE)
    assert "aten.addmm.default" not in c.texts["aot_forward"]
    assert "aten.threshold_backward.default" not in c.texts["aot_backward"]
    x = torch.randn(2, 4)
    c(x).sum().backward()
    g_c = lin.weight.grad.clone()
    lin.weight.grad = None
    torch.relu(lin(x)).sum().backward()
    torch.testing.assert_close(g_c, lin.weight.grad)


def test_decomposition_of_backward_op() -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    check(lambda x, w: ((x * w).relu().sum(),), [x, w])
    joint = trace_joint(fx.symbolic_trace(lambda x, w: ((x * w).relu().sum(),)), [x, w], decompositions=TABLE)
    assert "aten.threshold_backward.default" not in _targets(joint.gm)
