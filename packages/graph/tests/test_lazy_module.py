"""lazy_graph_module: a GraphModule whose Python code is generated when first needed."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

from kiln.graph import lazy_graph_module
from kiln.graph.lazy_module import LAZY_GRAPH_MODULE


def _graph() -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    g.output((g.call_function(operator.add, (y, 1.0)),))
    return g


def test_runs_prints_and_follows_graph_edits_like_a_graph_module():
    gm = lazy_graph_module(torch.nn.Module(), _graph())
    assert isinstance(gm, fx.GraphModule)
    x = torch.arange(4.0)
    torch.testing.assert_close(gm(x)[0], x * 2 + 1)
    assert "aten.mul.Tensor" in gm.code
    # an edit, then recompile (as kiln's passes do): the next call runs the edited graph
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    mul.args = (mul.args[0], 3.0)
    gm.recompile()
    torch.testing.assert_close(gm(x)[0], x * 3 + 1)
    assert "3.0" in gm.code


def test_code_is_not_generated_until_needed():
    if LAZY_GRAPH_MODULE is fx.GraphModule:
        pytest.skip("this torch has no lazy GraphModule: a plain one (code generated at once) is used")
    gm = lazy_graph_module(torch.nn.Module(), _graph())
    assert type(gm)._needs_recompile()  # nothing generated yet
    assert "aten.mul.Tensor" in gm.code
    assert not type(gm)._needs_recompile()
