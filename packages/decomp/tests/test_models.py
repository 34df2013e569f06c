"""Forward+backward graphs of the benchmark-suite models (small configs) decompose to core ATen.

Graphs come from kiln's own tracer (``trace(..., functionalize=True)``), except T5 (slice assignment
in ``_shift_right``) and ConvNeXt whose
channels-last ``adaptive_avg_pool2d`` path mutates view metadata (``as_strided_``): that needs the
full view functionalization of kiln.autograd, so its reference graphs come from torch's AOT autograd.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

from kiln.decomp import decompose, table
from kiln.graph import CORE_ATEN_OPS, verify

from .models import MODELS, aot_graphs, joint_graph

pytestmark = pytest.mark.slow


def _graphs(name):
    if name in ("convnext", "t5"):
        return [gm for gm, _ in aot_graphs(name)]
    return [joint_graph(name)[0]]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_graphs_decompose_to_core_and_prims(name):
    for gm in _graphs(name):
        core = decompose(gm, table("core_aten"))
        verify(core, "core_aten")
        targets = {n.target for n in core.graph.nodes if n.op == "call_function"}
        aten_ops = [t for t in targets if isinstance(t, torch._ops.OpOverload)]
        assert aten_ops and all(
            f"aten.{t._schema.name.split('::')[-1]}.{t._overloadname}" in CORE_ATEN_OPS for t in aten_ops)
        prims = decompose(core, table("prims"))
        verify(prims, "prims")
        assert all(n.target.namespace == "kiln_prims" for n in prims.graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))


@pytest.mark.parametrize("name,table_name", [("vit", "core_aten"), ("llama", "core_aten"), ("llama", "prims")])
def test_decomposed_training_step_matches_eager(name, table_name):
    torch.manual_seed(0)
    gm, params, inputs, step = joint_graph(name)
    out = decompose(gm, table(table_name))
    flat = [t for t in tree_flatten((list((params, inputs)), {}))[0] if isinstance(t, torch.Tensor)]
    got = out(*flat)
    expected = step(params, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
