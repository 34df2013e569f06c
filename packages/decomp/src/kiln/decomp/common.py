"""Small helpers shared by the decomposition families (plain functions over ``torch.ops.aten``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten

LOW_PRECISION = (torch.float16, torch.bfloat16)


def canonical_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dimension {dim} is out of range for a tensor of {ndim} dimensions")
    return dim % n


def reduction_dims(dim: int | Sequence[int] | None, ndim: int) -> list[int]:
    """``dim`` as a sorted list of non-negative dims; ``None`` or ``[]`` means all of them."""
    if dim is None:
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(ndim))
    return sorted({canonical_dim(d, ndim) for d in dims})


def scalar_like(x: torch.Tensor, value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A 0-dim tensor holding ``value`` on ``x``'s device, for ``where`` and friends."""
    return aten.scalar_tensor.default(value, dtype=dtype or x.dtype, device=x.device)


def zeros(shape: Sequence[Any], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return aten.full.default(list(shape), 0, dtype=dtype or like.dtype, device=like.device)


def convert(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` (no node when it already is)."""
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms and softmax accumulate in: fp32 for half types, like eager."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    return convert(x, compute_dtype(x.dtype))


def numel_of(x: torch.Tensor, dims: Sequence[int]) -> Any:
    n: Any = 1
    for d in dims:
        n = n * x.shape[d]
    return n


def keep_shape(x: torch.Tensor, dims: Sequence[int]) -> list[Any]:
    """``x``'s shape with ``dims`` reduced to 1."""
    return [1 if i in dims else s for i, s in enumerate(x.shape)]


def contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else aten.clone.default(x, memory_format=torch.contiguous_format)


def reshape(x: torch.Tensor, shape: Sequence[Any]) -> torch.Tensor:
    """A view when ``x`` is contiguous, else a contiguous copy viewed (same values either way)."""
    return aten.view.default(contiguous(x), list(shape))


def sum_to_shape(x: torch.Tensor, shape: Sequence[Any]) -> torch.Tensor:
    """Reduce a broadcast result back to ``shape`` (for gradients of broadcast operands)."""
    lead = x.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1]
    if dims:
        x = aten.sum.dim_IntList(x, dims, True)
    if lead:
        x = aten.view.default(x, list(shape))
    return x


def arange(n: Any, like: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return aten.arange.start_step(0, n, 1, dtype=dtype, device=like.device)


def where_scalar(cond: torch.Tensor, a: Any, b: Any, like: torch.Tensor) -> torch.Tensor:
    """``where`` accepting Python scalars for either branch (as 0-dim tensors of ``like``'s dtype)."""
    ta = a if isinstance(a, torch.Tensor) else scalar_like(like, a)
    tb = b if isinstance(b, torch.Tensor) else scalar_like(like, b)
    return aten.where.self(cond, ta, tb)


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of saved norm statistics: the input's on CPU, the accumulation type elsewhere (eager)."""
    return x.dtype if x.device.type == "cpu" else compute_dtype(x.dtype)
