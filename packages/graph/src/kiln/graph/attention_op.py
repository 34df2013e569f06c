"""``kiln_graph::attention``: scaled-dot-product attention whose kernel eager picks on every call.

Traced attention normally names one fused kernel (flash, memory-efficient, cuDNN), chosen from the
traced sizes. With symbolic sizes no single choice is right for every size: eager takes cuDNN's
kernel for GPT-2's masked attention where a choice valid for all sizes (memory-efficient attention
over a bias padded to 16 keys) ran 2.7x slower on an H200 (1.13 + 0.24 ms of bias copies per step
against cuDNN's 0.42 ms, bf16 8 x 512 tokens). This op defers the choice to run time: its kernel is
``F.scaled_dot_product_attention`` itself, so every call runs what eager runs for those sizes, masks
(bool or additive), alignment padding and empty sequences included. Its backward,
``kiln_graph::attention_backward``, recomputes the forward and takes eager's gradients (one extra
forward: for GPT-2 on an H200 cuDNN's forward + recomputed forward + backward, 1.8 ms per step, against
4 ms for memory-efficient attention over the padded bias): where eager picks cuDNN it calls cuDNN's
forward and backward ops itself, as eager's autograd does, else it recomputes under autograd (whose
nested backward cost GPT-2's training step ~2 ms of host time on the H200). A mask that
needs a gradient (a learned position bias) is not supported here: the tracer keeps such calls.

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


def _kiln_attention_backward(grad, q, k, v, mask, is_causal, scale, enable_gqa):
    """kiln_graph::attention_backward: the gradients of q, k and v, from eager's kernels (forward recomputed).
    Where eager picks cuDNN's kernel, its forward (for the log-sum-exp) and backward are called directly,
    as eager's autograd would call them; otherwise the forward is recomputed under autograd. An op's
    kernel runs with autograd's dispatch keys excluded: they are let back in for the recompute."""
    if q.is_cuda and not enable_gqa and (mask is None or mask.dtype in (q.dtype, torch.bool)) and \
            int(torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, scale=scale)) == 3:  # CUDNN_ATTENTION
        bias = mask
        if mask is not None and mask.dtype == torch.bool:  # as eager converts it before the kernel
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, True, 0.0, is_causal, False, scale=scale)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, out, lse, seed, offset, bias, cum_q, cum_k, max_q, max_k, 0.0, is_causal, scale=scale)
        return dq, dk, dv
    key = torch._C.DispatchKey.AutogradFunctionality
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
    torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                   scale=scale, enable_gqa=enable_gqa)
            return torch.autograd.grad(out, (q, k, v), grad)
    finally:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)
'''
_ns: dict[str, Any] = {"torch": torch}
exec(ATTENTION_SOURCE, _ns)  # noqa: S102 - our own source, shared with the generated wrapper
_attention = _ns["_kiln_attention"]
_attention_backward = _ns["_kiln_attention_backward"]


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


@torch.library.custom_op("kiln_graph::attention_backward", mutates_args=(),
                         schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, "
                                "float? scale, bool enable_gqa) -> (Tensor, Tensor, Tensor)")
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None, is_causal: bool, scale: float | None,
                       enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _attention_backward(grad, q, k, v, mask, is_causal, scale, enable_gqa)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             mask: torch.Tensor | None, is_causal: bool, scale: float | None,
                             enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, v, mask, is_causal, scale, enable_gqa = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.flags = (is_causal, scale, enable_gqa)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    if ctx.needs_input_grad[3]:
        raise RuntimeError("kiln_graph::attention: the mask needs a gradient, which this op does not compute "
                           "(the tracer keeps such attention calls as traced kernels)")
    q, k, v, mask = ctx.saved_tensors
    dq, dk, dv = ATTENTION_BACKWARD(grad, q, k, v, mask, *ctx.flags)
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)

ATTENTION = torch.ops.kiln_graph.attention.default
ATTENTION_BACKWARD = torch.ops.kiln_graph.attention_backward.default
ATTENTION_TARGET = "kiln_graph.attention.default"
ATTENTION_BACKWARD_TARGET = "kiln_graph.attention_backward.default"
