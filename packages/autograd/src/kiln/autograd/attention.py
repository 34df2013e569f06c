"""scaled_dot_product_attention on CUDA: trace the fused kernel eager would run.

``F.scaled_dot_product_attention`` is a composite that picks its kernel (flash, memory-efficient,
cuDNN, or the MATH decomposition) from the inputs' metadata. On fake tensors torch 2.11 answers MATH
for masked CUDA attention where eager picks cuDNN or memory-efficient attention, so a traced BERT or
GPT-2 held the fp32 bmm-softmax-bmm decomposition that eager never runs (2-3x slower). When the choice
on real tensors of the same layout differs from the fake one, the tracer calls that kernel's ATen op
itself, the way the composite would (same arguments, output 0): a boolean mask becomes an additive
one of the query's dtype (0 / -inf), and memory-efficient attention gets its bias expanded to
(batch, heads, L, S) (HF BERT's padding mask is a bool (B, 1, L, S) view). Outside the simple envelope
(no dropout, a bool mask or one of the query's dtype, equal head counts, an efficient-attention mask
whose last dim is a multiple of 16) the composite runs unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten

SDPA_TARGETS = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def _bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    bound = dict(_DEFAULTS)
    bound.update(zip(_PARAMS, args))
    if set(kwargs) - set(_PARAMS):
        return None
    bound.update(kwargs)
    return bound


def _real_choice(a: dict[str, Any]) -> int:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def real(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)

    with unset_fake_temporarily():
        return int(torch._fused_sdp_choice(real(a["query"]), real(a["key"]), real(a["value"]),
                                           real(a["attn_mask"]), a["dropout_p"], a["is_causal"],
                                           scale=a["scale"]))


def fused_attention(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fused kernel's output for this call, or None to let the composite run."""
    from torch.nn.attention import SDPBackend

    a = _bind(args, kwargs)
    if a is None or not torch.cuda.is_available():
        return None
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.dim() == 4 for t in (q, k, v)):
        return None
    if a["dropout_p"] != 0.0 or a["enable_gqa"] or k.shape[1] != q.shape[1] or \
            (mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype not in (q.dtype, torch.bool))):
        return None
    fake = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, a["is_causal"], scale=a["scale"]))
    choice = _real_choice(a)
    if choice == fake or (choice == int(SDPBackend.EFFICIENT_ATTENTION) and mask is not None and mask.shape[-1] % 16):
        return None  # an unaligned efficient-attention mask: the composite pads it
    need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if mask is not None and mask.dtype == torch.bool:  # as the composite's convert_boolean_attn_mask
        mask = aten.masked_fill.Scalar(aten.zeros_like(mask, dtype=q.dtype), aten.logical_not(mask), float("-inf"))
    if choice == int(SDPBackend.CUDNN_ATTENTION):
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, need_lse, 0.0, a["is_causal"], False,
                                                         scale=a["scale"])[0]
    if choice == int(SDPBackend.EFFICIENT_ATTENTION):
        if mask is not None:  # the composite's preprocess_mask
            mask = aten.expand(mask, [q.shape[0], q.shape[1], q.shape[2], k.shape[2]])
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, need_lse, 0.0, a["is_causal"],
                                                            scale=a["scale"])[0]
    return None
