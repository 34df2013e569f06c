"""Decomposition happens once in kiln's pipeline: kiln.autograd applies kiln.inductor's table while it
traces (the meta-package hands it over), the graphs it hands on say so (GraphAnnotations.decomposed_by),
and kiln.inductor's ``decompose`` pass copies them instead of running the table again (DESIGN.md:
capture -> autograd -> decomp -> inductor, one way)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import fx, nn

from kiln.autograd import aot
from kiln.decomp import decompose
from kiln.graph import GraphAnnotations, annotate, annotations_of, print_graph
from kiln.inductor import compile_graph, inductor_decompositions


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.fc(self.norm(x)))
        return nn.functional.silu(self.bn(h)).softmax(-1) + torch.addcmul(x, h, h, value=0.5)


def _compile(model: nn.Module, x: torch.Tensor) -> tuple[Any, list[fx.GraphModule], list[Any]]:
    """kiln.compile's inductor path (backends.py) with the graphs kiln.inductor receives recorded."""
    table = inductor_decompositions()
    seen: list[fx.GraphModule] = []
    compiled: list[Any] = []

    def compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
        seen.append(gm)
        compiled.append(compile_graph(gm, example_inputs))
        return compiled[-1]

    gm = fx.symbolic_trace(model)
    fn = aot(gm, [x], fw_compiler=compiler, bw_compiler=compiler, decompositions=table).fn
    return fn, seen, compiled


def _stripped(gm: fx.GraphModule) -> fx.GraphModule:
    copy = fx.GraphModule(gm, gm.graph)
    annotate(copy, GraphAnnotations())
    return copy


@pytest.mark.parametrize("training", [True, False])
def test_graphs_reach_inductor_decomposed_once(training: bool) -> None:
    torch.manual_seed(0)
    model = Block().train(training)
    ref = Block().train(training)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 16, requires_grad=training)
    with torch.set_grad_enabled(training):
        fn, seen, compiled = _compile(model, x)
    assert len(seen) == (2 if training else 1)
    table = inductor_decompositions()
    for gm in seen:
        assert annotations_of(gm).decomposed_by == table.name
        # running the table on it again (as if unannotated) changes nothing: it was fully decomposed
        assert print_graph(decompose(_stripped(gm), table, check=False)) == print_graph(gm)
    for c in compiled:
        assert "decompose" in c.texts["timings"]
    for _ in range(3):  # fresh inputs each call, against eager
        xi = torch.randn(8, 16, requires_grad=training)
        xr = xi.detach().clone().requires_grad_(training)
        with torch.set_grad_enabled(training):
            out, expected = fn(xi), ref(xr)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        if training:
            out.pow(2).sum().backward()
            expected.pow(2).sum().backward()
            torch.testing.assert_close(xi.grad, xr.grad, rtol=1e-4, atol=1e-5)
    if training:
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
