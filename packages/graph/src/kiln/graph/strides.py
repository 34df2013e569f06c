"""ATen's ``computeStride``: the strides of a view of a strided tensor as another shape.

capture's shape rules, kiln.decomp's ``view`` and kiln.inductor's view lowering all need the answer torch
gives, so it lives here once. Plain arithmetic: sizes may be ints or symbolic ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def view_strides(shape: Sequence[Any], strides: Sequence[Any], new_shape: Sequence[Any]) -> list[Any] | None:
    """The strides ``view(new_shape)`` gives a tensor of ``shape``/``strides``, or None when no view exists
    (``reshape`` then copies, ``view`` raises). As ATen: a 0-d tensor views as strides of 1; a tensor with
    no elements keeps its strides for the same shape and otherwise gets contiguous ones."""
    if not shape:
        return [1] * len(new_shape)
    numel = 1
    for s in shape:
        numel = numel * s
    if numel == 0:
        if list(shape) == list(new_shape):
            return list(strides)
        out: list[Any] = [1] * len(new_shape)
        for d in range(len(new_shape) - 2, -1, -1):
            out[d] = max(new_shape[d + 1], 1) * out[d + 1]
        return out
    new_strides: list[Any] = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel = tensor_numel * shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel = view_numel * new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel = view_numel = 1
    return new_strides if view_d == -1 else None


def may_overlap_itself(shape: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Whether two elements of a strided tensor of static layout may share memory (an expanded dim,
    overlapping ``unfold`` windows, an ``as_strided`` view): False when, dims sorted by stride, each stride
    reaches past everything the smaller ones span (ATen's ``has_internal_overlap`` calls the rest "too
    hard" and refuses writes only where a stride is 0; a write's element order then decides the values).
    A symbolic size or stride of a dim with more than one element: False (not decided here)."""
    dims = [(st, n) for n, st in zip(shape, strides) if not (isinstance(n, int) and n == 1)]
    if any(not isinstance(x, int) for d in dims for x in d):
        return False
    if any(n == 0 for _, n in dims):
        return False  # no elements
    span = 0  # the furthest element reached by the dims so far (in elements, from the first)
    for st, n in sorted((abs(st), n) for st, n in dims):
        if st <= span:
            return True
        span += st * (n - 1)
    return False
