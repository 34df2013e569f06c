"""Shape rules for view ops: the fake result of ``Tensor.view`` / ``reshape`` / ``transpose`` /
``permute`` / ``unsqueeze`` / ``expand`` and basic indexing (``x[:, None, 1:5]``) by integer
arithmetic on sizes and strides, made with one ``aten.as_strided`` call.

Why: torch runs fake views through Python reference implementations (``_reshape_view_helper``
with its size-oblivious checks; ``__getitem__`` as a chain of slice / select / unsqueeze ops, each
a separate fake dispatch, never served by the fake-tensor cache since views alias). In a GPT-2
warm start these were ~0.5-2 ms a call and about a third of the fake-dispatch time of capture.

The result is a view of the input (same storage, ``_base``, version counter) with the sizes,
strides and storage offset ATen computes (``computeStride`` for ``view``, ``applySlicing`` for
indexing). Each rule returns ``None`` -- the ordinary path, where torch raises its own errors --
for anything it is not sure of: symbolic sizes, a result autograd would track (the graph of a
view differs from an ``as_strided``), inference mode, quantized / conjugated / negated / sparse
tensors, ``view(dtype)``, tensor or bool indices, empty results, out-of-range indices.
A test checks every rule against the ordinary path over many argument sets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from kiln.graph import view_strides

from .functions import contiguous_strides

Dim = int | torch.SymInt  # a size, stride or offset (symbolic under dynamic shapes)
Layout = tuple[Sequence[Dim], Sequence[Dim], Dim]  # sizes, strides, storage offset
MethodRule = Callable[[Any, tuple, dict], Any]


def _plain(x: Any) -> bool:
    """A fake tensor whose views the rules can describe, whose result autograd does not track."""
    if type(x) is not FakeTensor or x.layout is not torch.strided or x.is_quantized or \
            x.is_conj() or x.is_neg():
        return False
    if x.requires_grad and torch.is_grad_enabled():
        return False
    if torch.is_inference_mode_enabled():
        return False
    return all(type(s) is int for s in x.shape) and all(type(s) is int for s in x.stride()) and \
        type(x.storage_offset()) is int


def _make(x: torch.Tensor, layout: Layout | None) -> Any:
    if layout is None:
        return None
    sizes, strides, offset = layout
    if 0 in sizes:
        return None  # empty results: strides and offsets are conventions; torch decides them
    return torch.ops.aten.as_strided.default(x, sizes, strides, offset)


def _ints(values: Sequence[Any]) -> list[int] | None:
    return list(values) if all(type(v) is int for v in values) else None


def _shape_args(args: tuple) -> list[int] | None:
    """``view(2, 3)`` / ``view((2, 3))`` / ``view(torch.Size(...))`` as ints, else None."""
    if not args:
        return None  # view() without a shape: torch's error
    if len(args) == 1 and type(args[0]) in (tuple, list, torch.Size):
        args = tuple(args[0])
    return _ints(args)


def _infer_size(shape: list[int], numel: int) -> list[int] | None:
    """``shape`` with its one -1 filled in, when it has ``numel`` elements (else None)."""
    if any(s < -1 for s in shape) or shape.count(-1) > 1:
        return None
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if -1 in shape:
        if known == 0 or numel % known:
            return None
        shape = [numel // known if s == -1 else s for s in shape]
    elif known != numel:
        return None
    return shape


def _view_layout(x: torch.Tensor, args: tuple) -> Layout | None:
    shape = _shape_args(args)
    if shape is None:
        return None
    numel = x.numel()
    if numel == 0:
        return None
    new = _infer_size(shape, numel)
    if new is None or not new or x.dim() == 0:
        return None
    if 1 in new and x.stride() != contiguous_strides(x.shape):
        # Note: a size-1 dim's stride is a convention, and torch's fake view (a Python reference
        # implementation) keeps other conventions than ATen's for strided inputs; every other
        # stride of a view is fixed by the elements it addresses, so both agree on them
        return None
    strides = view_strides(list(x.shape), list(x.stride()), new)
    return None if strides is None else (new, strides, x.storage_offset())


def _view(x: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs or not _plain(x):
        return None
    return _make(x, _view_layout(x, args))


def _reshape(x: Any, args: tuple, kwargs: dict) -> Any:
    """reshape is a view when one exists (else a copy: the ordinary path)."""
    return _view(x, args, kwargs)


def _dim(d: Any, ndim: int) -> int | None:
    if type(d) is not int or not -ndim <= d < ndim:
        return None
    return d % ndim


def _transpose(x: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) != 2 or not _plain(x) or x.dim() == 0:
        return None
    a, b = _dim(args[0], x.dim()), _dim(args[1], x.dim())
    if a is None or b is None:
        return None
    sizes, strides = list(x.shape), list(x.stride())
    sizes[a], sizes[b] = sizes[b], sizes[a]
    strides[a], strides[b] = strides[b], strides[a]
    return _make(x, (sizes, strides, x.storage_offset()))


def _permute(x: Any, args: tuple, kwargs: dict) -> Any:
    dims = _shape_args(args)
    if kwargs or dims is None or not _plain(x) or len(dims) != x.dim() or x.dim() == 0:
        return None
    norm = [_dim(d, x.dim()) for d in dims]
    if None in norm or len(set(norm)) != len(norm):
        return None
    sizes, strides = x.shape, x.stride()
    return _make(x, ([sizes[d] for d in norm], [strides[d] for d in norm],  # type: ignore[index]
                     x.storage_offset()))


def _unsqueeze_at(sizes: list[int], strides: list[int], d: int) -> None:
    """ATen's unsqueeze: the new dim's stride is size * stride of the dim it lands before."""
    stride = 1 if d >= len(sizes) else sizes[d] * strides[d]
    sizes.insert(d, 1)
    strides.insert(d, stride)


def _unsqueeze(x: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) != 1 or not _plain(x):
        return None
    d = _dim(args[0], x.dim() + 1)
    if d is None:
        return None
    sizes, strides = list(x.shape), list(x.stride())
    _unsqueeze_at(sizes, strides, d)
    return _make(x, (sizes, strides, x.storage_offset()))


def _expand(x: Any, args: tuple, kwargs: dict) -> Any:
    shape = _shape_args(args)
    if kwargs or shape is None or not _plain(x) or len(shape) < x.dim():
        return None
    lead = len(shape) - x.dim()
    sizes, strides = [], []
    for i, s in enumerate(shape):
        if i < lead:
            if s < 0:
                return None
            sizes.append(s)
            strides.append(0)
            continue
        old, old_stride = x.shape[i - lead], x.stride()[i - lead]
        if s == -1 or s == old:
            sizes.append(old)
            strides.append(old_stride)
        elif old == 1 and s >= 0:
            sizes.append(s)
            strides.append(0)
        else:
            return None
    return _make(x, (sizes, strides, x.storage_offset()))


def _slice(size: int, s: slice) -> tuple[int, int, int] | None:
    """(start, length, step) of a slice with int or None bounds and a positive step."""
    if any(v is not None and type(v) is not int for v in (s.start, s.stop, s.step)):
        return None
    step = 1 if s.step is None else s.step
    if step <= 0:
        return None  # torch raises for these; let it
    start, stop, _ = s.indices(size)
    return start, len(range(start, stop, step)), step


def getitem_layout(x: torch.Tensor, key: Any) -> Layout | None:
    """Basic indexing (ints, slices, None, one Ellipsis) as ATen's ``applySlicing`` does it."""
    items = list(key) if type(key) is tuple else [key]
    if any(not (type(i) in (int, slice) or i is None or i is Ellipsis) for i in items):
        return None
    consumed = sum(1 for i in items if type(i) in (int, slice))
    if items.count(Ellipsis) > 1 or consumed > x.dim():
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.dim() - consumed)
    sizes, strides, offset = list(x.shape), list(x.stride()), x.storage_offset()
    d = 0  # the result's dim the next item applies to
    for i in items:
        if i is None:
            _unsqueeze_at(sizes, strides, d)
            d += 1
        elif type(i) is int:
            if not -sizes[d] <= i < sizes[d]:
                return None  # IndexError from torch
            offset += (i % sizes[d]) * strides[d]
            del sizes[d], strides[d]
        else:
            sl = _slice(sizes[d], i)
            if sl is None:
                return None
            start, length, step = sl
            offset += start * strides[d]
            sizes[d], strides[d] = length, strides[d] * step
            d += 1
    return sizes, strides, offset


def fast_getitem(x: Any, key: Any) -> Any:
    """The fake result of ``x[key]`` for basic indexing, or None (the ordinary path)."""
    if not _plain(x):
        return None
    return _make(x, getitem_layout(x, key))


# Tensor method name -> rule(tensor, args, kwargs).
FAST_METHODS: dict[str, MethodRule] = {
    "view": _view,
    "reshape": _reshape,
    "transpose": _transpose,
    "permute": _permute,
    "unsqueeze": _unsqueeze,
    "expand": _expand,
}
