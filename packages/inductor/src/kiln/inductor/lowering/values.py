"""Tensor values during lowering: a strided view of a buffer, or a lazy pointwise body not yet stored.

Views fold into indexing: a view of a ``Strided`` value is another ``Strided`` value when strides can
express it, otherwise a ``Lazy`` body that loads through the index arithmetic. A ``Lazy`` value is
inlined into every consumer (recomputed) until the lowering decides to realize it into a buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

import sympy
import torch

from ..ir import Expr, IndexExpr, Load, TensorRef, cast, fold_divmod, index_vars, substitute_index


@dataclass(frozen=True, slots=True)
class Strided:
    buffer: str
    shape: tuple[IndexExpr, ...]
    stride: tuple[IndexExpr, ...]
    offset: IndexExpr
    dtype: torch.dtype

    def ref(self) -> TensorRef:
        return TensorRef(self.buffer, self.shape, self.stride, self.offset, self.dtype)


@dataclass(frozen=True, slots=True)
class Lazy:
    shape: tuple[IndexExpr, ...]
    dtype: torch.dtype
    body: Expr  # over i0..i{ndim-1}
    # the lazy value this one reshapes (views.py; a cast keeps it, pointwise.py): realizing this one
    # stores that one in its own iteration space, so the loop fuses with its producer's (a LayerNorm
    # over [B, L | C] whose output feeds a matmul as [B*L, C]), and returns the free view of it
    # (LoweringContext.realize)
    view_of: Lazy | None = field(default=None, compare=False)


TensorValue = Strided | Lazy


def is_tensor(v: object) -> TypeGuard[TensorValue]:
    return isinstance(v, (Strided, Lazy))


def value_at(v: TensorValue, idx: Sequence[IndexExpr]) -> Expr:
    """The body computing ``v[idx]``."""
    if len(idx) != len(v.shape):
        raise ValueError(f"indexing a {len(v.shape)}-d value with {len(idx)} indices")
    if isinstance(v, Strided):
        return Load(v.buffer, _strided_index(v.offset, v.stride, tuple(idx)), v.dtype)
    mapping = dict(zip(index_vars("i", len(v.shape)), idx))
    if all(k == val for k, val in mapping.items()):
        return v.body
    return substitute_index(v.body, mapping)  # simultaneous: i0 -> i1, i1 -> i0 swaps do not collide


@functools.lru_cache(maxsize=1 << 16)
def _strided_index(offset: IndexExpr, stride: tuple[IndexExpr, ...], idx: tuple[IndexExpr, ...]) -> IndexExpr:
    """``expand(offset + sum(i * s))`` with split-and-merged dims folded (``fold_divmod``), cached (keyed
    on all of its inputs)."""
    return fold_divmod(sympy.expand(offset + sum((i * s for i, s in zip(idx, stride)), sympy.Integer(0))))


def broadcast_at(v: TensorValue, out_idx: Sequence[IndexExpr], dtype: torch.dtype | None = None) -> Expr:
    """``v`` read at an index of a broadcast result (numpy rules: align right, size-1 dims read 0)."""
    nd = len(v.shape)
    tail = list(out_idx[len(out_idx) - nd:]) if nd else []
    idx = [sympy.Integer(0) if v.shape[k] == 1 else tail[k] for k in range(nd)]
    e = value_at(v, idx)
    return cast(e, dtype) if dtype is not None else e


def as_lazy(v: TensorValue) -> Lazy:
    if isinstance(v, Lazy):
        return v
    return Lazy(v.shape, v.dtype, value_at(v, index_vars("i", len(v.shape))))
