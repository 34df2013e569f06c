"""What the min-cut saves under AMP: parameters (held by the module anyway) rather than their bf16
casts, which the backward recomputes; gradients unchanged."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ag_util import compile_fn  # type: ignore[import-not-found]

from kiln.autograd import partition, trace_joint

aten = torch.ops.aten


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor]:
    return ((F.linear(torch.relu(F.linear(x, w1)), w2)).float().square().mean(),)


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 32, generator=g), torch.randn(64, 32, generator=g).requires_grad_(),
            torch.randn(16, 64, generator=g).requires_grad_()]


def test_amp_saves_weights_not_their_casts() -> None:
    from torch import fx
    inputs = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        joint = trace_joint(fx.symbolic_trace(_mlp), inputs)
    parts = partition(joint, "min_cut")
    out = next(n for n in parts.fw_gm.graph.nodes if n.op == "output").args[0]
    saved = out[len(out) - parts.n_saved:]
    casts_of_weights = [n for n in saved if n.target is aten._to_copy.default
                        and n.args[0].op == "placeholder" and n.args[0].meta["val"].requires_grad]
    assert not casts_of_weights, parts.as_text()
    assert sum(n.op == "placeholder" for n in saved) == 1  # w2 (for relu(x @ w1)'s gradient), for free
    # the backward recomputes the bf16 casts it needs
    assert any(n.target is aten._to_copy.default for n in parts.bw_gm.graph.nodes)


def test_amp_gradients_unchanged() -> None:
    inputs = _inputs()
    e_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _mlp(*e_in)[0].backward()
        compiled = compile_fn(_mlp, inputs)
        (loss,) = compiled(*inputs)
    loss.backward()
    for a, b in zip(inputs[1:], e_in[1:]):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-2, rtol=1e-2)
