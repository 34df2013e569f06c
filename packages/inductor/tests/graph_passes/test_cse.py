"""Equal pure calls on equal arguments are computed once (graph_passes/cse.py); random ops, uninitialised
factories and values an in-place op updates are never shared."""

from __future__ import annotations

import torch
from torch import fx

from kiln.inductor import compile_graph
from kiln.inductor.graph_passes.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def _targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _layer_masks(layers: int) -> fx.GraphModule:
    """Each "layer" pads the same mask into 16-aligned rows and reads it (as kiln.autograd's symbolic
    attention does per attention call)."""
    g = fx.Graph()
    x, mask = g.placeholder("x"), g.placeholder("mask")
    for _ in range(layers):
        rows = g.call_function(aten.zeros.default, ([2, 16],), {"dtype": torch.float32, "device": torch.device("cpu")})
        bias = g.call_function(aten.slice_scatter.default, (rows, mask, -1, 0, 11))
        bias = g.call_function(aten.slice.Tensor, (bias, -1, 0, 11))
        x = g.call_function(aten.add.Tensor, (x, bias))
    g.output((x,))
    return fx.GraphModule({}, g)


def test_repeated_mask_padding_is_computed_once() -> None:
    gm = _layer_masks(4)
    x, mask = torch.randn(2, 11), torch.randn(2, 11)
    want = x + 4 * mask
    assert eliminate_common_subexpressions(gm) == 9  # 3 of each of zeros, slice_scatter, slice
    assert _targets(gm).count("aten.slice_scatter.default") == 1
    torch.testing.assert_close(gm(x, mask)[0], want)
    for _ in range(3):  # compiled end to end, fresh inputs each call
        x, mask = torch.randn(2, 11), torch.randn(2, 11)
        torch.testing.assert_close(compile_graph(_layer_masks(4), [x, mask]).fn(x, mask)[0], x + 4 * mask)


def test_arguments_that_differ_are_not_merged() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.add.Tensor, (x, 1))
    b = g.call_function(aten.add.Tensor, (x, 1.0))  # another scalar type: another result dtype for ints
    c = g.call_function(aten.mul.Tensor, (x, 2))
    d = g.call_function(aten.mul.Tensor, (x, 2))
    g.output((a, b, c, d))
    gm = fx.GraphModule({}, g)
    assert eliminate_common_subexpressions(gm) == 1
    a, b, c, d = gm(torch.arange(3))
    assert a.dtype == torch.int64 and b.dtype == torch.float32


def test_random_ops_and_empty_are_never_shared() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    r1 = g.call_function(aten.rand_like.default, (x,))
    r2 = g.call_function(aten.rand_like.default, (x,))
    e1 = g.call_function(aten.empty.memory_format, ([3],), {"dtype": torch.float32})
    e2 = g.call_function(aten.empty.memory_format, ([3],), {"dtype": torch.float32})
    g.output((r1, r2, e1, e2))
    gm = fx.GraphModule({}, g)
    assert eliminate_common_subexpressions(gm) == 0
    r1, r2, _, _ = gm(torch.zeros(1000))
    assert not torch.equal(r1, r2)
    x = torch.zeros(1000)  # compiled: the two draws still differ on every call
    cg = compile_graph(fx.GraphModule({}, g), [x])
    for _ in range(3):
        r1, r2, _, _ = cg.fn(torch.zeros(1000))
        assert not torch.equal(r1, r2)


def test_a_value_an_inplace_op_updates_is_not_shared() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    z1 = g.call_function(aten.zeros.default, ([3],), {"dtype": torch.float32})
    z2 = g.call_function(aten.zeros.default, ([3],), {"dtype": torch.float32})
    g.call_function(aten.add_.Tensor, (z1, x))  # z1 is updated in place: z2 must stay zeros
    g.output((z1, z2))
    gm = fx.GraphModule({}, g)
    assert eliminate_common_subexpressions(gm) == 0
    z1, z2 = gm(torch.ones(3))
    assert torch.equal(z2, torch.zeros(3)) and torch.equal(z1, torch.ones(3))


def test_a_value_updated_through_a_view_is_not_shared() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    z1 = g.call_function(aten.zeros.default, ([2, 3],), {"dtype": torch.float32})
    z2 = g.call_function(aten.zeros.default, ([2, 3],), {"dtype": torch.float32})
    row = g.call_function(aten.select.int, (z1, 0, 0))
    g.call_function(aten.add_.Tensor, (row, x))  # writes z1's first row through a view
    g.output((z1, z2))
    gm = fx.GraphModule({}, g)
    assert eliminate_common_subexpressions(gm) == 0
    z1, z2 = gm(torch.ones(3))
    assert torch.equal(z2, torch.zeros(2, 3)) and float(z1.sum()) == 3.0


def _equal_outputs_graph() -> fx.GraphModule:
    """Four outputs that are four tensors in eager: two equal adds (merged by the cse pass), and a clone
    and a clone of a detach of one product (different graph values, one equal loop for the lowering)."""
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.add.Tensor, (x, 1))
    b = g.call_function(aten.add.Tensor, (x, 1))
    m = g.call_function(aten.mul.Tensor, (x, x))
    c = g.call_function(aten.clone.default, (m,))
    d = g.call_function(aten.clone.default, (g.call_function(aten.detach.default, (m,)),))
    g.output((a, b, c, d))
    return fx.GraphModule({}, g)


def test_outputs_merged_into_one_value_keep_their_own_memory() -> None:
    """Merging must not make two outputs one tensor: writing into one would change the other (eager's
    are distinct). Compiled on fresh inputs each call; each output written and the others compared."""
    gm = _equal_outputs_graph()
    assert eliminate_common_subexpressions(gm) == 1
    cg = compile_graph(_equal_outputs_graph(), [torch.randn(5)])
    for _ in range(3):
        x = torch.randn(5)
        outs = list(cg.fn(x))
        want = [x + 1, x + 1, x * x, x * x]
        assert len({o.untyped_storage().data_ptr() for o in outs}) == 4
        for k, o in enumerate(outs):
            o.add_(10)
            want[k] = want[k] + 10
            for got, w in zip(outs, want):
                torch.testing.assert_close(got, w, rtol=0, atol=0)
