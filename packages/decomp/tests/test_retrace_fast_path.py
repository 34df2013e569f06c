"""decompose() skips the re-trace of a graph it would give back unchanged (an ATen graph whose ops
the table does not decompose): the result is a copy with the same nodes and meta. Anything the
re-trace would change still goes through it."""

from __future__ import annotations

import torch
from torch import fx

from kiln.decomp import decompose, select, table, trace
from kiln.decomp import retrace as rt

aten = torch.ops.aten


def _ops(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _core_graph() -> tuple[fx.GraphModule, torch.Tensor]:
    x = torch.randn(4, 6)
    return decompose(trace(lambda x: (torch.nn.functional.gelu(x).softmax(-1), x.t()), [x]),
                     table("core_aten")), x


def test_already_decomposed_graph_is_copied_not_retraced(monkeypatch) -> None:
    g, x = _core_graph()
    calls = []
    monkeypatch.setattr(rt, "_retrace", lambda *a: calls.append(a) or g)
    out = decompose(g, table("core_aten"))
    assert not calls
    assert out is not g and out.graph is not g.graph  # callers rewrite the result in place
    assert [(n.name, n.target) for n in out.graph.nodes] == [(n.name, n.target) for n in g.graph.nodes]
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
