"""torch functions whose ATen schema reads a symbolic size as a plain number, traced as torch code.

Note (why a polyfill, not the function): ``aten::linspace`` takes ``int steps`` and
``aten::scaled_dot_product_attention`` a ``float? scale``. A SymInt or SymFloat passed there is
specialised by torch's argument parser (``steps == 7``, ``1/sqrt(s0) == 0.378`` guarded), so a graph
calling ``torch.linspace(0, 1, x.shape[0])`` recompiled for every size. When such an argument is
symbolic, the interpreter inlines the pure-torch version below instead: ATen ops whose symbolic
arguments are ``SymInt`` sizes or ``Scalar`` values, which stay symbolic through autograd, the
decompositions and inductor (a SymFloat scalar is a float64 value over the kernels' size arguments).
A call with concrete arguments is recorded as the function itself, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def linspace_(start, end, steps, *, dtype=None, device=None):
    """ATen's linspace (RangeFactories): ``start + step * i`` for the first half, ``end - step *
    (steps - 1 - i)`` for the rest, in the output dtype (float64 for an integer one, then truncated)."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    compute = dtype if dtype.is_floating_point else torch.float64
    if steps == 0:
        return torch.empty(0, dtype=dtype, device=device)
    if steps == 1:
        return torch.full((1,), start, dtype=compute, device=device).to(dtype)
    step = (end - start) / (steps - 1)
    i = torch.arange(steps, device=device)
    forward = start + step * i.to(compute)
    backward = end - step * (steps - 1 - i).to(compute)
    return torch.where(i < steps // 2, forward, backward).to(dtype)


def scaled_dot_product_attention_(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                  scale=None, enable_gqa=False):
    """Attention with a symbolic ``scale``: the query scaled by it (a symbolic Scalar) and the kernel's
    own scale 1. The same function; in half precision the scaled query is rounded once more."""
    return F.scaled_dot_product_attention(query * scale, key, value, attn_mask, dropout_p, is_causal,
                                          scale=1.0, enable_gqa=enable_gqa)


def _symbolic(v: Any) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat)) and not v.node.expr.is_number


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(v, bool)


def _bind(names: tuple[str, ...], args: list, kwargs: dict) -> dict[str, Any] | None:
    if len(args) > len(names) or set(kwargs) & set(names[:len(args)]):
        return None
    return {**dict(zip(names, args)), **kwargs}


def _linspace(args: list, kwargs: dict) -> Callable[..., Any] | None:
    a = _bind(("start", "end", "steps"), args, kwargs)
    if a is None or set(a) - {"start", "end", "steps", "dtype", "device", "layout", "requires_grad"}:
        return None  # out=, pin_memory=: the ordinary call
    if a.get("layout", torch.strided) is not torch.strided or a.get("requires_grad", False):
        return None
    dtype = a.get("dtype")
    if dtype is not None and (dtype.is_complex or dtype is torch.bool):
        return None
    values = (a.get("start"), a.get("end"), a.get("steps"))
    if not all(_number(v) for v in values) or not any(_symbolic(v) for v in values):
        return None
    return linspace_


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _attention(args: list, kwargs: dict) -> Callable[..., Any] | None:
    a = _bind(_SDPA_PARAMS, args, kwargs)
    if a is None or set(a) - set(_SDPA_PARAMS) or not _symbolic(a.get("scale")):
        return None
    return scaled_dot_product_attention_


# id(torch function) -> (args, kwargs) -> the polyfill to inline for this call, or None
_RULES: dict[int, Callable[[list, dict], Callable[..., Any] | None]] = {
    id(torch.linspace): _linspace,
    id(F.scaled_dot_product_attention): _attention,
}


def size_polyfill(fn: Any, args: list, kwargs: dict) -> Callable[..., Any] | None:
    """The pure-torch version to inline for ``fn(*args, **kwargs)`` when the call passes a symbolic
    number where the schema takes a plain one; None to record the call itself."""
    rule = _RULES.get(id(fn))
    return None if rule is None else rule(args, kwargs)
