"""One ATen recorder (STYLE.md rule 11): kiln.decomp's ``GraphRecorder`` is the only dispatch mode in
kiln that records ATen calls into an fx graph; kiln.autograd's functionalizing tracer extends it and
kiln.inductor's front end uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from kiln.autograd.tracer import TracingMode
from kiln.decomp import GraphRecorder, trace

ROOT = Path(__file__).resolve().parent.parent


def _recording_modes() -> list[str]:
    """Classes under packages/*/src that handle dispatch (``__torch_dispatch__``) and build graph nodes."""
    found = []
    for path in sorted(ROOT.glob("packages/*/src/**/*.py")):
        tree = ast.parse(path.read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            builds = any(isinstance(n, ast.Attribute) and n.attr == "call_function" for n in ast.walk(cls))
            if "__torch_dispatch__" in methods and builds:
                found.append(f"{path.relative_to(ROOT)}:{cls.name}")
    return found


def test_decomp_graph_recorder_is_the_only_recording_dispatch_mode() -> None:
    assert _recording_modes() == ["packages/decomp/src/kiln/decomp/tracer.py:GraphRecorder"]
    assert issubclass(TracingMode, GraphRecorder)


def test_autograd_traces_through_the_shared_recorder() -> None:
    """kiln.autograd's trace goes through GraphRecorder.dispatch (the table first), then records the
    functional form of a mutation; the same program through kiln.decomp's own trace agrees."""
    from kiln.autograd import trace_inference

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[1:].mul_(2)  # a write into a view: functionalized by autograd's extension
        return torch.nn.functional.gelu(y)

    x = torch.randn(4, 3)
    gm = torch.fx.symbolic_trace(f)
    joint = trace_inference(gm, [x])
    for _ in range(3):  # fresh inputs, against eager
        xi = torch.randn(4, 3)
        torch.testing.assert_close(joint.gm(xi)[0], f(xi))
    ops = {str(n.target) for n in joint.gm.graph.nodes if n.op == "call_function"}
    assert "aten.mul_.Tensor" not in ops and any("scatter" in o for o in ops)  # functional
    torch.testing.assert_close(trace(lambda x: f(x), [x])(x), f(x))
