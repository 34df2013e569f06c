"""decompose() skips the re-trace of a graph it would give back unchanged (an ATen graph whose ops
the table does not decompose): the result is a copy with the same nodes and meta. Anything the
re-trace would change still goes through it."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from kiln.decomp import Decomposition, DecompTable, decompose, select, table, trace
from kiln.decomp import retrace as rt

aten = torch.ops.aten


def _ops(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _core_graph() -> tuple[fx.GraphModule, torch.Tensor]:
    x = torch.randn(4, 6)
    return decompose(trace(lambda x: (torch.nn.functional.gelu(x).softmax(-1), x.t()), [x]),
                     table("core_aten")), x


def test_already_decomposed_graph_is_copied_not_retraced() -> None:
    g, x = _core_graph()
    for n in g.graph.nodes:
        n.meta["kiln_test_mark"] = n.name  # a copy keeps every node's meta; a re-trace keeps only values
    out = decompose(g, table("core_aten"))
    assert [n.meta.get("kiln_test_mark") for n in out.graph.nodes] == [n.name for n in g.graph.nodes]
    assert out is not g and out.graph is not g.graph  # callers rewrite the result in place
    assert [(n.name, n.target) for n in out.graph.nodes] == [(n.name, n.target) for n in g.graph.nodes]
    # the source's fake values themselves: nothing ran again on fake tensors
    assert all(a.meta.get("val") is b.meta.get("val") for a, b in zip(out.graph.nodes, g.graph.nodes))
    for a, b in zip(out(x), g(x)):
        torch.testing.assert_close(a, b)
    # rewriting the copy leaves the original alone
    next(n for n in out.graph.nodes if n.op == "call_function").meta["mark"] = 1
    assert all("mark" not in n.meta for n in g.graph.nodes)


def test_graph_with_an_op_to_decompose_is_retraced() -> None:
    x = torch.randn(5)
    g = trace(lambda x: torch.nn.functional.gelu(torch.nn.functional.silu(x)), [x])
    assert not rt._already_decomposed(g, table("core_aten"))
    out = decompose(g, select(["aten.silu.default"], table("core_aten")))
    assert aten.silu.default not in _ops(out) and aten.gelu.default in _ops(out)
    torch.testing.assert_close(out(x), torch.nn.functional.gelu(torch.nn.functional.silu(x)))


def test_missing_meta_dead_nodes_and_example_inputs_take_the_retrace() -> None:
    g, x = _core_graph()
    t = table("core_aten")
    assert rt._already_decomposed(g, t)
    node = next(n for n in g.graph.nodes if n.op == "call_function")
    val = node.meta.pop("val")
    assert not rt._already_decomposed(g, t)  # a node without its fake value
    node.meta["val"] = val
    with g.graph.inserting_after(node):
        g.graph.call_function(aten.neg.default, (node,))  # dead: the re-trace drops it
    assert not rt._already_decomposed(g, t)
    out = decompose(g, t, [x])  # explicit example inputs: always re-traced
    assert len(_ops(out)) == len(_ops(g)) - 1


def test_torch_dialect_graph_is_retraced() -> None:
    gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    assert not rt._already_decomposed(gm, table("core_aten"))


# ---- partial re-trace: only decomposed nodes (and what their values change) run on fake tensors ----

def _conv_bn_joint() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """A conv + batch-norm + view forward and its backward, traced keeping the batch-norm ops."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3, requires_grad=True)
    gamma, beta = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)

    def f(x, w, gamma, beta):
        y = torch.nn.functional.conv2d(x, w)
        y = torch.nn.functional.batch_norm(y, None, None, gamma, beta, training=True)
        z = torch.relu(y).permute(0, 2, 3, 1).reshape(-1, 4)
        loss = (z * z).sum()
        return (loss, *torch.autograd.grad(loss, [w, gamma, beta]))

    full = table("core_aten")
    keep = [op for op in full if "batch_norm" not in str(op)]
    args = [x, w, gamma, beta]
    return trace(f, args, select(keep, full)), args


def _structure(gm: fx.GraphModule) -> list[tuple]:
    def meta(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device)
        return tuple(meta(x) for x in v) if isinstance(v, (tuple, list)) else v
    return [(n.op, n.name, str(n.target), str(n.args), str(n.kwargs), meta(n.meta.get("val")))
            for n in gm.graph.nodes]


def _reused_values(gm: fx.GraphModule, source: fx.GraphModule) -> int:
    """How many of ``gm``'s call nodes hold one of ``source``'s fake values itself (not a re-run's)."""
    values = [n.meta["val"] for n in source.graph.nodes if "val" in n.meta]
    return sum(any(n.meta.get("val") is v for v in values) for n in gm.graph.nodes if n.op == "call_function")


def test_partial_retrace_reuses_traced_values_and_builds_the_same_graph() -> None:
    g, args = _conv_bn_joint()
    bn = [n for n in g.graph.nodes if "batch_norm" in str(n.target)]
    assert bn, "the source graph keeps its batch-norm ops"
    partial = decompose(g, table("core_aten"))
    full = decompose(g, table("core_aten"), args)  # explicit example inputs: every node runs again
    assert _structure(partial) == _structure(full)
    assert not any("batch_norm" in str(n.target) for n in partial.graph.nodes)
    assert _reused_values(full, g) == 0 and _reused_values(partial, g) > 0  # the copied nodes kept theirs
    for a, b in zip(partial(*args), g(*args)):
        torch.testing.assert_close(a, b)


def test_partial_retrace_reruns_a_node_whose_input_changed_metadata() -> None:
    """A decomposition giving other strides than the traced op: its consumers run again, so their
    values follow the new strides (as a full re-trace gives)."""
    x = torch.randn(3, 4)
    g = trace(lambda x: torch.nn.functional.silu(x.t()) + 1, [x])
    silu = next(n for n in g.graph.nodes if n.target == aten.silu.default)
    add = next(iter(silu.users))
    # pretend the trace gave silu a row-major result (the decomposition keeps x.t()'s strides)
    fake = silu.meta["val"]
    with fake.fake_mode:
        silu.meta["val"] = torch.empty_strided((4, 3), (3, 1), dtype=fake.dtype)
        add.meta["val"] = torch.empty_strided((4, 3), (3, 1), dtype=fake.dtype)
    out = decompose(g, select(["aten.silu.default"], table("core_aten")))
    last = next(n for n in reversed(out.graph.nodes) if n.op == "call_function")
    assert last.target == aten.add.Tensor and last.meta["val"].stride() == (1, 4)
    torch.testing.assert_close(out(x), torch.nn.functional.silu(x.t()) + 1)


def test_graph_traced_with_the_table_is_not_decomposed_again() -> None:
    """A graph that says it was traced with a table (GraphAnnotations.decomposed_by, as kiln.autograd
    writes) is copied, not re-traced: the table is not run on it a second time, even for an op the
    table has (here silu, deliberately left in to show the table is not consulted)."""
    from kiln.graph import GraphAnnotations, annotate

    x = torch.randn(5)
    g = trace(lambda x: torch.nn.functional.silu(x) * 2, [x])
    calls: list[Any] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return NotImplemented

    named = DecompTable("once", [Decomposition(aten.silu.default, spy, "core_aten", "test")], None)
    annotate(g, GraphAnnotations(decomposed_by="once"))
    out = decompose(g, named)
    assert not calls and aten.silu.default in _ops(out)
    assert out is not g and out.meta == g.meta  # a copy, annotations kept
    annotate(g, GraphAnnotations(decomposed_by="another table"))
    decompose(g, named)
    assert len(calls) == 1  # not traced with this table: it runs
