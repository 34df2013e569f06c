"""Layouts of the tensors an entry pins by identity (module parameters and buffers), checked cheaply.

A parameter is guarded by identity (ID_MATCH) and passed to the graph as the very object seen at
capture. Identity does not cover its layout: ``p.data = other`` (and ``module.to(dtype)``,
``.half()``, ``.to(memory_format=...)``, which do that for every parameter), ``swap_tensors``,
``p.requires_grad_(...)`` and the in-place metadata methods (``t_``, ``set_``, ``as_strided_``, ...)
change the dtype, device, shape, strides or requires_grad of the same object, and a graph compiled
for the old layout then returns wrong values (or crashes).

Note: a full TENSOR_MATCH per parameter doubles the guard check of a 200-parameter module, and no
per-tensor read is cheap enough: ``map(id, params)`` alone costs ~40 ns a tensor, ``map(Tensor.stride,
params)`` ~200 ns (a loaded 2-core machine), ``_version`` does not change on ``set_data``, and
in-place updates change ``_version`` on every training step. So the ways a
tensor's layout changes in place are counted instead: ``install`` wraps them (once per process,
when the first entry pins a tensor) to bump ``EPOCH``. An entry's check compares one int while
nothing was relaid out since its last check; when something was (anywhere in the process), it
compares every pinned tensor's layout once, and remembers the new epoch when they all still match.
What is not wrapped (``torch.ops.aten.set_`` called directly, C++ code changing a tensor's metadata)
is not seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.graph import tensor_expectation

EPOCH = [0]  # bumped after every layout change made through the wrapped entry points

# in-place methods that change a tensor's dtype, shape, strides, storage or requires_grad
_METADATA_METHODS = ("set_", "resize_", "resize_as_", "as_strided_", "t_", "transpose_", "swapdims_",
                     "swapaxes_", "squeeze_", "unsqueeze_", "requires_grad_")
_installed: list[bool] = []


def _bump() -> None:
    EPOCH[0] += 1


def _counted(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:  # after the change: a check racing with it sees the new layout on its next call
            _bump()
    counted.__kiln_counted__ = method  # type: ignore[attr-defined]
    return counted


def _counted_setter(descriptor: Any) -> property:
    """A property for ``torch.Tensor`` over TensorBase's C attribute: the same get, a counted set."""
    def set_value(self: torch.Tensor, value: Any) -> None:
        try:
            descriptor.__set__(self, value)
        finally:
            _bump()
    return property(descriptor.__get__, set_value, doc=descriptor.__doc__ or f"TensorBase.{descriptor.__name__}")


def install() -> None:
    """Count layout changes from now on (idempotent). ``torch.Tensor.data`` and ``requires_grad``
    become properties over TensorBase's (their setters counted), the metadata methods and
    ``torch._C._swap_tensor_impl`` (``torch.utils.swap_tensors``) counted wrappers."""
    if _installed:
        return
    _installed.append(True)
    base = torch._C.TensorBase
    for name in ("data", "requires_grad"):
        setattr(torch.Tensor, name, _counted_setter(base.__dict__[name]))
    for name in _METADATA_METHODS:
        method = getattr(torch.Tensor, name)
        if not hasattr(method, "__kiln_counted__"):
            setattr(torch.Tensor, name, _counted(method))
    swap = torch._C._swap_tensor_impl
    if not hasattr(swap, "__kiln_counted__"):
        def counted_swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
            try:
                swap(t1, t2)
            finally:
                _bump()
        counted_swap.__kiln_counted__ = swap  # type: ignore[attr-defined]
        torch._C._swap_tensor_impl = counted_swap


def _layout(t: torch.Tensor) -> tuple:
    return (t.dtype, t.device, t.shape, t.stride(), t.requires_grad)


@dataclass(frozen=True, slots=True)
class PinnedLayouts:
    """The layouts an entry's pinned tensors had at capture. Per call: ``EPOCH[0] == seen[0] or
    recheck()`` (``same()``; an entry's check inlines it)."""

    sources: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    expected: tuple[tuple, ...]  # TENSOR_MATCH payloads, for recompile reasons
    seen: list[int]  # the epoch at which the layouts last matched
    recheck: Callable[[], bool]  # compare every layout; on a match remember the epoch

    def same(self) -> bool:
        return EPOCH[0] == self.seen[0] or self.recheck()

    def failure(self) -> tuple[str, tuple, tuple] | None:
        """The first tensor whose layout changed: (source, expected, actual)."""
        for source, t, want in zip(self.sources, self.tensors, self.expected, strict=True):
            got = tensor_expectation(t)
            if got != want:
                return source, want, got
        return None


def pinned_layouts(pinned: Sequence[tuple[str, torch.Tensor]]) -> PinnedLayouts | None:
    """The layout check of ``pinned`` (source, tensor) as they are now; None when nothing is pinned."""
    if not pinned:
        return None
    install()
    tensors = tuple(t for _, t in pinned)
    expected = tuple(map(_layout, tensors))
    seen = [EPOCH[0]]
    epoch = EPOCH

    def recheck() -> bool:
        now = epoch[0]  # read first: a change made while comparing is seen by the next call
        if tuple(map(_layout, tensors)) != expected:
            return False
        seen[0] = now
        return True
    return PinnedLayouts(tuple(s for s, _ in pinned), tensors,
                         tuple(tensor_expectation(t) for t in tensors), seen, recheck)
