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

from kiln.graph import ATTENTION, has_symbolic_sizes, log

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


def _layout(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return (_at_hints(t.shape), _at_hints(t.stride()), t.dtype, str(t.device), _needs_grad(t))


def _needs_grad(t: Any) -> bool:
    """Whether autograd will differentiate through ``t`` here: eager's kernel choice depends on it (cuDNN
    attention takes no mask that needs a gradient)."""
    return isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


def _at_hints(xs: Any) -> tuple[int, ...]:
    """Sizes or strides with each symbolic one at its example value (read without adding a guard)."""
    return tuple(int(x.node.hint) if isinstance(x, torch.SymInt) else int(x) for x in xs)  # type: ignore[arg-type]


def _backend_flags() -> tuple[Any, ...]:
    """The global switches eager's choice depends on (``sdpa_kernel`` contexts set them too)."""
    b = torch.backends.cuda
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(),
            b.cudnn_sdp_enabled(), tuple(order()) if order is not None else ())


class KernelChoices:
    """The kernel eager picks for tensors of given layouts, asked once per (layouts, backend switches) on
    real tensors. ``EAGER_CHOICES`` is the process's; a test constructs its own and reads ``queries``."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, ...], int] = {}
        self.queries = 0  # how many times real tensors were made to ask eager

    def choice(self, a: dict[str, Any], dense_mask: bool = False) -> int:
        """The kernel eager picks for these arguments' layouts; ``dense_mask``: for the mask as kiln would
        pass it (an additive mask of the query's dtype, contiguous). The real tensors are allocated
        outside every tracing mode (inside them, the real q/k/v of each layer stayed alive after the
        compile)."""
        key = (tuple(_layout(a[k]) for k in ("query", "key", "value", "attn_mask")), dense_mask,
               a["dropout_p"], a["is_causal"], a["scale"], _backend_flags())
        hit = self.known.get(key)
        if hit is not None:
            return hit
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.utils._python_dispatch import _disable_current_modes

        def real(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            return torch.empty_strided(_at_hints(t.shape), _at_hints(t.stride()), dtype=t.dtype, device=t.device,
                                       requires_grad=_needs_grad(t))

        self.queries += 1
        with unset_fake_temporarily(), _disable_current_modes():
            q, k, v, mask = real(a["query"]), real(a["key"]), real(a["value"]), real(a["attn_mask"])
            if dense_mask and mask is not None:
                mask = torch.empty(tuple(mask.shape), dtype=q.dtype, device=q.device,  # (real: sizes are ints)
                                   requires_grad=_needs_grad(a["attn_mask"]))
            choice = int(torch._fused_sdp_choice(q, k, v, mask, a["dropout_p"], a["is_causal"], scale=a["scale"]))
            del q, k, v, mask
        self.known[key] = choice
        return choice


EAGER_CHOICES = KernelChoices()


def fused_attention(args: tuple[Any, ...], kwargs: dict[str, Any], choices: KernelChoices = EAGER_CHOICES) -> Any:
    """The fused kernel's output for this call, or None to let the composite run."""
    from torch.nn.attention import SDPBackend

    a = _bind(args, kwargs)
    if a is None or not torch.cuda.is_available():
        return None
    if torch.is_autocast_enabled("cuda"):
        a = autocast_arguments(a, torch.get_autocast_dtype("cuda"))
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.dim() == 4 for t in (q, k, v)):
        return None
    if not q.dtype == k.dtype == v.dtype:  # the composite raises, as in eager; the kernels would read garbage
        return None
    if any(has_symbolic_sizes(t) for t in (q, k, v, mask) if isinstance(t, torch.Tensor)):
        return _symbolic_attention(q, k, v, mask, a, choices)
    if a["dropout_p"] != 0.0 or a["enable_gqa"] or k.shape[1] != q.shape[1] or \
            (mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype not in (q.dtype, torch.bool))):
        return None
    fake = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, a["is_causal"], scale=a["scale"]))
    choice = choices.choice(a)
    dense = False
    if choice == SDPBackend.MATH.value and mask is not None:
        # eager would run MATH (fp32 bmm-softmax-bmm) only because of the mask's layout (HF BERT's is a
        # stride-0 expanded bool view, which the fused kernels do not take): a dense copy of the mask,
        # a few MB, makes the fused kernel usable, same function in the query's precision
        dense_choice = choices.choice(a, dense_mask=True)
        if dense_choice != SDPBackend.MATH.value:
            choice, dense = dense_choice, True
            log("perf_hints").info("attention: a dense copy of the %s mask %s lets a fused kernel run where "
                                   "eager runs MATH", mask.dtype, tuple(mask.shape))
    if choice == fake or (choice == SDPBackend.EFFICIENT_ATTENTION.value and mask is not None and mask.shape[-1] % 16):
        return None  # an unaligned efficient-attention mask: the composite pads it
    need_lse = any(_needs_grad(t) for t in (q, k, v, mask))
    out = _fused_call(choice, q, k, v, mask, dense, need_lse, a)
    if out is not None and dense:
        # MATH's safe softmax gives 0 for a query that may attend to nothing; the fused kernels need not
        allowed = mask if mask.dtype == torch.bool else aten.ne.Scalar(mask, float("-inf"))
        out = aten.where.ScalarOther(aten.any.dim(allowed, -1, True), out, 0.0)
    return out


def autocast_arguments(a: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """SDPA's arguments as CUDA autocast gives them to eager's composite (its lower-precision policy:
    every floating CUDA tensor but float64 cast to ``dtype``, the mask included). The kernels this module
    calls are not on autocast's lists, so they would get the arguments as traced: HF Llama's rotary
    embedding (``q * cos``, cos in fp32) promotes q and k to fp32 while v stays bf16, and kiln's
    Llama-350M training graph with dynamic=True passed them so to memory-efficient attention, which
    checks no dtypes (on the H200: an illegal memory access, and on a 2-layer model a NaN loss on a
    repeated call)."""
    out = dict(a)
    for key in ("query", "key", "value", "attn_mask"):
        t = a[key]
        if (isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.is_floating_point()
                and t.dtype not in (torch.float64, dtype)):
            out[key] = aten._to_copy.default(t, dtype=dtype)
    return out


def _symbolic_attention(q: Any, k: Any, v: Any, mask: Any, a: dict[str, Any],
                        choices: KernelChoices = EAGER_CHOICES) -> Any:
    """Attention over symbolic sizes: a kernel valid for every size, chosen without reading a size.

    Note: the composite asks ``_fused_sdp_choice`` on the fake tensors, and its cuDNN checks read the
    sizes as ints, which pins every symbolic size of the graph (an H200 serving stream recompiled per
    request). So the choice is made here from what does not depend on sizes: flash attention (half
    precision, no mask, head dim a multiple of 8 up to 256) or memory-efficient attention (no mask, or
    a non-causal call with a mask: ``_masked_efficient``), and the MATH form otherwise. Outside
    flash's envelope, a call for which eager picks a fused kernel at the example sizes calls
    ``kiln_graph::attention`` instead, which runs eager's choice per call (``_eager_fused_at_hints``). A causal call uses the fused kernels only when queries and keys have the same
    length symbol (the kernels' causal alignment for L != S differs from the composite's)."""
    from torch.nn.attention import SDPBackend

    head = q.shape[-1]
    same_len = _same_size(q.shape[2], k.shape[2])
    fused = (a["dropout_p"] == 0.0 and not a["enable_gqa"] and mask is None and isinstance(head, int)
             and head % 8 == 0 and _same_size(q.shape[1], k.shape[1]) and (same_len or not a["is_causal"])
             and all(isinstance(t.stride(-1), int) and t.stride(-1) == 1 for t in (q, k, v)))
    need_lse = any(_needs_grad(t) for t in (q, k, v, mask))
    b = torch.backends.cuda
    masked = (mask is not None and isinstance(mask, torch.Tensor) and mask.dtype in (q.dtype, torch.bool)
              and mask.dim() == 4 and a["dropout_p"] == 0.0 and not a["enable_gqa"] and isinstance(head, int)
              and head % 8 == 0 and _same_size(q.shape[1], k.shape[1]) and not a["is_causal"]
              and all(isinstance(t.stride(-1), int) and t.stride(-1) == 1 for t in (q, k, v)))
    if fused and q.dtype in (torch.float16, torch.bfloat16) and head <= 256 and b.flash_sdp_enabled():
        choice = SDPBackend.FLASH_ATTENTION.value
    elif fused and b.mem_efficient_sdp_enabled():
        choice = SDPBackend.EFFICIENT_ATTENTION.value
    elif _eager_fused_at_hints(a, mask, choices):
        # eager runs a fused kernel at the example sizes: its own choice on every call (kiln.graph
        # attention_op.py says why), the backward from eager's kernels too
        log("perf_hints").info("attention with symbolic sizes (a mask, GQA or unequal causal lengths): "
                               "eager picks the kernel per call")
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            # converted once in the graph (one kernel; layers reading the same mask share it), not by
            # eager inside every call and again in every backward (GPT-2 training on an H200: 36 ATen
            # where/not/fill calls per step, ~1.5 ms of host time at 8 x 128 tokens)
            mask = _additive(mask, q)
        return ATTENTION(q, k, v, mask, a["is_causal"], a["scale"], a["enable_gqa"])
    elif masked and b.mem_efficient_sdp_enabled():
        return _masked_efficient(q, k, v, mask, need_lse, a)
    else:
        log("perf_hints").info("attention with symbolic sizes: traced as its MATH form (a mask, dropout or "
                               "unequal lengths under is_causal)")
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            # the composite converts a bool mask before MATH; _scaled_dot_product_attention_math itself
            # adds a bool mask as 0/1 (a wrong result for every masked position)
            mask = _additive(mask, q)
        return aten._scaled_dot_product_attention_math(q, k, v, mask, a["dropout_p"], a["is_causal"], None,
                                                       scale=a["scale"], enable_gqa=a["enable_gqa"])[0]
    return _fused_call(choice, q, k, v, None, False, need_lse, a)


def _eager_fused_at_hints(a: dict[str, Any], mask: Any, choices: KernelChoices | None = None) -> bool:
    """Whether ``kiln_graph::attention`` should run this call: no dropout, no mask needing a gradient
    (the op's backward computes none), and eager picks a fused kernel at the example sizes. Where eager
    would run MATH there (HF BERT's stride-0 bool mask), the traced forms below are faster."""
    from torch.nn.attention import SDPBackend

    if a["dropout_p"] != 0.0 or (mask is not None and (not isinstance(mask, torch.Tensor) or mask.requires_grad)):
        return False
    return (choices or EAGER_CHOICES).choice(a) != SDPBackend.MATH.value


def _masked_efficient(q: Any, k: Any, v: Any, mask: Any, need_lse: bool, a: dict[str, Any]) -> Any:
    """Masked attention over symbolic sizes as memory-efficient attention (eager's choice for a
    masked half-precision call; MATH would run it as fp32 bmm-softmax-bmm).

    The kernel reads the bias rows at 16-element aligned offsets, which a symbolic key length cannot
    promise: the additive mask is written into rows padded to a multiple of 16 and viewed back to the
    key length (the composite's pad_bias, with the pad computed as a size expression). A query row
    that may attend to nothing stays 0, as MATH's safe softmax makes it."""
    s = k.shape[2]
    bias = _additive(mask, q) if mask.dtype == torch.bool else mask
    bias = aten.expand(bias, [q.shape[0], q.shape[1], q.shape[2], s])
    # zeros + slice_scatter, not constant_pad_nd: its C++ kernel refuses a symbolic pad list when the
    # compilers re-trace the graph
    rows = aten.zeros.default([q.shape[0], q.shape[1], q.shape[2], (s + 15) // 16 * 16], dtype=bias.dtype,
                              device=q.device)
    bias = aten.slice.Tensor(aten.slice_scatter.default(rows, bias, -1, 0, s), -1, 0, s)
    out = aten._scaled_dot_product_efficient_attention(q, k, v, bias, need_lse, 0.0, False,
                                                        scale=a["scale"])[0]
    allowed = mask if mask.dtype == torch.bool else aten.ne.Scalar(mask, float("-inf"))
    return aten.where.ScalarOther(aten.any.dim(allowed, -1, True), out, 0.0)


def _additive(mask: Any, q: Any) -> Any:
    """A bool mask (True: attend) as the additive mask in the query's dtype, as the composite's
    convert_boolean_attn_mask makes it."""
    zeros = aten.zeros.default(list(mask.shape), dtype=q.dtype, device=q.device)
    return aten.masked_fill.Scalar(zeros, aten.logical_not(mask), float("-inf"))


def _same_size(x: Any, y: Any) -> bool:
    """``x`` and ``y`` are the same size for every input: equal ints, or the same symbolic expression
    (compared as expressions, so no guard is added)."""
    if isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt):
        return isinstance(x, torch.SymInt) and isinstance(y, torch.SymInt) and x.node.expr == y.node.expr
    return bool(x == y)


def _fused_call(choice: int, q: Any, k: Any, v: Any, mask: Any, dense: bool, need_lse: bool,
                a: dict[str, Any]) -> Any:
    from torch.nn.attention import SDPBackend

    if mask is not None and mask.dtype == torch.bool:
        mask = _additive(mask, q)
    elif dense:
        mask = aten.clone.default(mask, memory_format=torch.contiguous_format)
    if choice == SDPBackend.FLASH_ATTENTION.value:
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, a["is_causal"], False, scale=a["scale"])[0]
    if choice == SDPBackend.CUDNN_ATTENTION.value:
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, need_lse, 0.0, a["is_causal"], False,
                                                         scale=a["scale"])[0]
    if choice == SDPBackend.EFFICIENT_ATTENTION.value:
        if mask is not None:  # the composite's preprocess_mask
            mask = aten.expand(mask, [q.shape[0], q.shape[1], q.shape[2], k.shape[2]])
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, need_lse, 0.0, a["is_causal"],
                                                            scale=a["scale"])[0]
    return None
