from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

from kiln.graph import TensorSpec, VerificationError, print_graph, verify


def _aten_graph(target, *consts) -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(target, (x, *consts))
    g.output((y,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_torch_dialect_accepts_traced_code() -> None:
    gm = fx.symbolic_trace(lambda x: torch.relu(x) + x.sum())
    verify(gm, "torch")
    assert "torch.relu" in print_graph(gm)


def test_torch_dialect_rejects_call_module() -> None:
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(VerificationError, match="parameters must be placeholders"):
        verify(gm, "torch")


def test_aten_dialect_rejects_in_place_ops() -> None:
    verify(_aten_graph(torch.ops.aten.add.Tensor, 1.0), "aten")
    with pytest.raises(VerificationError, match="mutates"):
        verify(_aten_graph(torch.ops.aten.add_.Tensor, 1.0), "aten")


def test_core_aten_rejects_non_core_ops() -> None:
    verify(_aten_graph(torch.ops.aten.exp.default), "core_aten")
    with pytest.raises(VerificationError, match="not in the core ATen set"):
        verify(_aten_graph(torch.ops.aten.gelu.default), "core_aten")


def test_aten_dialect_rejects_torch_functions() -> None:
    with pytest.raises(VerificationError, match="not an ATen operator"):
        verify(_aten_graph(torch.relu), "aten")
    verify(_aten_graph(operator.getitem, 0), "aten")


def test_printer_is_stable_and_shows_specs() -> None:
    gm = _aten_graph(torch.ops.aten.mul.Tensor, 2.0)
    gm.graph.find_nodes(op="placeholder")[0].meta["spec"] = TensorSpec.from_tensor(torch.ones(2, 3))
    text = print_graph(gm)
    assert text == print_graph(gm)
    assert text.splitlines() == [
        "%x = input 'x'  # float32[2, 3] stride=(3, 1) cpu",
        "%mul_tensor = aten.mul.Tensor(%x, 2.0)",
        "return (%mul_tensor,)",
    ]
