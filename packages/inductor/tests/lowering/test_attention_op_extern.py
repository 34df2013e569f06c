"""``kiln_graph::attention`` (kiln.graph attention_op.py) in a compiled graph with symbolic sizes: an
extern the wrapper calls through its own copy of the op's function (a saved program needs no kiln
import), one compiled graph right for every length, and pointwise work around it fused as usual."""

from __future__ import annotations

import torch
from dynamic_helpers import CPP, check_sizes, symbolic_graph

from kiln.graph import ATTENTION
from kiln.inductor import compile_graph


def _block(x: torch.Tensor, m: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, length, _ = x.shape
    qkv = (x @ w).view(b, length, 3, 2, 8)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    out = ATTENTION(q, k, v, m, False, None, False)
    return torch.relu(out.transpose(1, 2).reshape(b, length, 16)) + x


def _inputs(n: int, w: torch.Tensor):
    keep = torch.rand(2, 1, n, n) > 0.3
    keep[..., 0] = True
    return torch.randn(2, n, 16), keep, w


def test_attention_op_over_symbolic_lengths() -> None:
    w = torch.randn(16, 48)
    gm, examples = symbolic_graph(_block, *_inputs(12, w), dynamic={0: (1,), 1: (2, 3)})
    assert "kiln_graph.attention" in gm.code
    cg = compile_graph(gm, examples, options=CPP)
    assert cg.backend == "inductor", cg.texts.get("fallbacks")
    code = cg.texts["output_code"]
    assert "def _kiln_attention(" in code and "_kiln_attention(" in code[code.index("def call_owned"):]
    assert not cg.loop_program.size_guards  # type: ignore[attr-defined]
    check_sizes(cg, _block, lambda n: _inputs(n, w), (12, 1, 5, 33))
