"""torch.cond captured as a subgraph op: node form, eager runs, fullgraph, and clear errors."""

import pytest
import torch
from torch import fx, nn

import kiln.capture as kc
from kiln.graph import verify

from .conftest import Recorder


def _cond_nodes(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]


def test_node_form_and_submodules():
    def f(x, y):
        return torch.cond(x.sum() > 0, lambda a, b: a + b, lambda a, b: a - b, (x, y)) * 2
    rec = Recorder()
    opt = kc.optimize(f, rec, fullgraph=True)
    for sign in (1, -1):
        x, y = torch.randn(4).abs() * sign, torch.randn(4)
        torch.testing.assert_close(opt(x, y), f(x, y))
    assert rec.count == 1  # one graph serves both branches: the predicate is data, not a guard
    gm = rec.graphs[0]
    (node,) = _cond_nodes(gm)
    pred, t, e, ops = node.args
    assert t.op == "get_attr" and e.op == "get_attr"
    assert isinstance(getattr(gm, t.target), fx.GraphModule) and isinstance(getattr(gm, e.target), fx.GraphModule)
    assert isinstance(ops, tuple) and [o.target for o in ops] == ["l_x", "l_y"]
    for sub in (getattr(gm, t.target), getattr(gm, e.target)):
        assert len([n for n in sub.graph.nodes if n.op == "placeholder"]) == 2
    verify(gm, "torch")


def test_closures_and_parameters_are_lifted_operands():
    lin = nn.Linear(4, 4)

    def f(x):
        z = x * 3
        return torch.cond(x.mean() > 0, lambda a: lin(a) + z, lambda a: a - z, (x,))
    rec = Recorder()
    opt = kc.optimize(f, rec, fullgraph=True)
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(opt(x), f(x))
    (node,) = _cond_nodes(rec.graphs[0])
    assert len(node.args[3]) == 4  # x, lin.weight, lin.bias, z


def test_nested_cond_and_training():
    w = torch.randn(4, requires_grad=True)

    def f(x):
        def outer(a):
            return torch.cond(a.sum() > 1, lambda b: b * w, lambda b: b + w, (a,))
        return torch.cond(x.sum() > 0, outer, lambda a: a.cos() * w, (x,)).sum()
    rec = Recorder()
    opt = kc.optimize(f, rec, fullgraph=True)
    for _ in range(4):
        x = torch.randn(4)
        got = opt(x)
        (g_got,) = torch.autograd.grad(got, w)
        want = f(x)
        (g_want,) = torch.autograd.grad(want, w)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(g_got, g_want)
    assert rec.count == 1


def test_python_bool_predicate_inlines_one_branch():
    def f(x, flag: bool):
        return torch.cond(flag, lambda a: a + 1, lambda a: a - 1, (x,))
    rec = Recorder()
    opt = kc.optimize(f, rec, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x, True), x + 1)
    assert not _cond_nodes(rec.graphs[0])


@pytest.mark.parametrize("body,needle", [
    (lambda a: print("x") or a, "print"),
    (lambda a: a * a.sum().item(), "item"),
])
def test_break_inside_branch_is_unsupported(body, needle):
    def f(x):
        return torch.cond(x.sum() > 0, body, lambda a: a, (x,))
    for fullgraph in (True, False):
        kc.reset()
        with pytest.raises(kc.Unsupported, match="torch.cond true branch") as info:
            kc.optimize(f, Recorder(), fullgraph=fullgraph)(torch.randn(3))
        assert "hint:" in str(info.value) and needle in str(info.value).lower()


def test_branch_side_effect_and_mismatch_are_unsupported():
    class Box:
        pass
    box = Box()

    def writes(x):
        def t(a):
            box.v = 1
            return a
        return torch.cond(x.sum() > 0, t, lambda a: a, (x,))

    def mismatch(x):
        return torch.cond(x.sum() > 0, lambda a: a, lambda a: a.sum(), (x,))
    with pytest.raises(kc.Unsupported, match="writes to state"):
        kc.optimize(writes, Recorder())(torch.randn(3))
    with pytest.raises(kc.Unsupported, match="disagree on output 0"):
        kc.optimize(mismatch, Recorder())(torch.randn(3))


def test_eager_backend_and_explain():
    def f(x):
        return torch.cond(x[0] > 0, lambda a: a.sin(), lambda a: a.cos(), (x,))
    ex = kc.explain(f)(torch.randn(5))
    assert ex.graph_count == 1 and ex.break_count == 0
    opt = kc.optimize(f, lambda gm, inputs: gm.forward)
    x = torch.randn(5)
    torch.testing.assert_close(opt(x), f(x))
