"""ensure_meta fills only the missing fake values when the graph's others share one fake mode (a
rewrite such as pad_matmuls adds a few nodes to a traced graph), and re-runs the whole graph
otherwise. The values it computes match eager's shapes and dtypes."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from tracer import trace

from kiln.inductor.decomp_bridge import ensure_meta

aten = torch.ops.aten


def _graph():
    args = [torch.randn(6, 8), torch.randn(8, 5)]
    gm = trace(lambda x, w: torch.relu(x @ w) + 1, *args)
    for n in gm.graph.nodes:
        n.meta.pop("val", None)
    ensure_meta(gm, args)
    return gm, args


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def test_a_new_node_gets_its_value_in_the_existing_mode_and_the_others_are_kept() -> None:
    gm, args = _graph()
    before = {n: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta}
    modes = {v.fake_mode for v in before.values() if isinstance(v, FakeTensor)}
    assert len(modes) == 1
    last = _calls(gm)[-1]
    with gm.graph.inserting_after(last):
        new = gm.graph.call_function(aten.sum.dim_IntList, (last, [1]))
    ensure_meta(gm, args)
    assert all(n.meta["val"] is v for n, v in before.items())  # not recomputed
    val = new.meta["val"]
    assert isinstance(val, FakeTensor) and val.fake_mode in modes
    assert tuple(val.shape) == (6,) and val.dtype == torch.float32


def test_mixed_modes_or_missing_placeholders_run_the_whole_graph() -> None:
    gm, args = _graph()
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder")
    del ph.meta["val"]
    first = _calls(gm)[0]
    del first.meta["val"]
    ensure_meta(gm, args)
    assert isinstance(first.meta["val"], FakeTensor)
    assert tuple(first.meta["val"].shape) == (6, 5)
    assert isinstance(ph.meta["val"], FakeTensor) and tuple(ph.meta["val"].shape) == (6, 8)
