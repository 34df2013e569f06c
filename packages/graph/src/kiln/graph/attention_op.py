"""``kiln_graph::attention``: scaled-dot-product attention whose kernel eager picks on every call.

Traced attention normally names one fused kernel (flash, memory-efficient, cuDNN), chosen from the
traced sizes. With symbolic sizes no single choice is right for every size: eager takes cuDNN's
kernel for GPT-2's masked attention where a choice valid for all sizes (memory-efficient attention
over a bias padded to 16 keys) ran 2.7x slower on an H200 (1.13 + 0.24 ms of bias copies per step
against cuDNN's 0.42 ms, bf16 8 x 512 tokens). This op defers the choice to run time: its kernel is
``F.scaled_dot_product_attention`` itself, so every call runs what eager runs for those sizes, masks
(bool or additive), alignment padding and empty sequences included. Inference only: it has no
backward (a training graph keeps a traced fused kernel, whose backward the joint graph holds).

Its fake result is laid out (batch, length, heads, head dim) in memory, as the fused CUDA kernels
return it for the usual (B, L, H, D)-transposed operands; a compiled wrapper re-strides a result
that comes back otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

# The wrapper module of a compiled graph defines this function too (kiln.inductor's codegen adds the
# source): a saved program runs with torch alone, without kiln.graph registering the op.
ATTENTION_SOURCE = '''
def _kiln_attention(q, k, v, mask, is_causal, scale, enable_gqa):
    """kiln_graph::attention (kiln.graph attention_op.py): attention in the kernel eager picks for this call."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                            scale=scale, enable_gqa=enable_gqa)
'''
_ns: dict[str, Any] = {"torch": torch}
exec(ATTENTION_SOURCE, _ns)  # noqa: S102 - our own source, shared with the generated wrapper
_attention = _ns["_kiln_attention"]


@torch.library.custom_op("kiln_graph::attention", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float? scale, "
                                "bool enable_gqa) -> Tensor")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
              scale: float | None, enable_gqa: bool) -> torch.Tensor:
    return _attention(q, k, v, mask, is_causal, scale, enable_gqa)  # type: ignore[no-any-return]


@attention.register_fake
def _attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                    scale: float | None, enable_gqa: bool) -> torch.Tensor:
    b, h, length = q.shape[0], q.shape[1], q.shape[2]
    d = v.shape[-1]
    return q.new_empty((b, length, h, d)).transpose(1, 2)


ATTENTION = torch.ops.kiln_graph.attention.default
ATTENTION_TARGET = "kiln_graph.attention.default"
