"""Graphs that read tensor constants (get_attr) compile, run and save like any other graph."""

from __future__ import annotations

import torch
from helpers import run_portable
from torch import fx

from kiln.inductor import compile_graph

aten = torch.ops.aten


def _graph_with_constants() -> tuple[fx.GraphModule, torch.Tensor, torch.Tensor]:
    """x -> cat([empty, x * scale], 0) + bias (scale = 2, 0-d): HF's DynamicCache concatenates onto ``torch.tensor([])``, and a
    non-contiguous constant checks that strides survive."""
    root = torch.nn.Module()
    root.empty = torch.tensor([])
    root.bias = torch.arange(24.0).reshape(4, 6).t()  # (6, 4), strides (1, 6)
    root.scale = torch.tensor(2.0)  # 0-d (DeBERTa-v2's scale)
    g = fx.Graph()
    x = g.placeholder("x")
    empty, bias, scale = g.get_attr("empty"), g.get_attr("bias"), g.get_attr("scale")
    cat = g.call_function(aten.cat.default, ([empty, g.call_function(aten.mul.Tensor, (x, scale))], 0))
    g.output((g.call_function(aten.add.Tensor, (cat, bias)),))
    return fx.GraphModule(root, g), root.empty, root.bias


def test_constants_are_compiled_not_run_through_aten() -> None:
    gm, _, bias = _graph_with_constants()
    x = torch.randn(6, 4)
    cg = compile_graph(gm, [x])
    assert cg.backend == "inductor", cg.texts.get("fallbacks")  # was "inductor(eager fallback)"
    (out,) = cg.fn(x)
    torch.testing.assert_close(out, x * 2 + bias)
    (again,) = cg.fn.call_owned([x + 1])
    torch.testing.assert_close(again, (x + 1) * 2 + bias)
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 3  # the caller's graph is left as it was


def test_saved_program_carries_its_constants(tmp_path) -> None:
    gm, _, bias = _graph_with_constants()
    x = torch.randn(6, 4)
    cg = compile_graph(gm, [x])
    (out,) = run_portable(cg, tmp_path, [x])
    torch.testing.assert_close(out, x * 2 + bias)
