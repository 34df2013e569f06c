"""View bookkeeping for functionalization: every tensor is a root (owns its storage) or a chain of
view steps from a root. A mutation of a view is written back into the root with scatter ops
(slice_scatter, select_scatter, diagonal_scatter, as_strided_scatter) so the graph stays functional.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class ViewStep:
    """One view op applied to the previous tensor in a chain (``index`` picks a multi-output view)."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]  # arguments after ``self``
    kwargs: tuple[tuple[str, Any], ...]
    index: int | None = None

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        out = self.op(t, *self.args, **dict(self.kwargs))
        return out[self.index] if self.index is not None else out


@dataclass(eq=False)
class Root:
    """The current functional value of one storage."""

    tensor: torch.Tensor  # the fake tensor owning the storage
    node: fx.Node
    input_index: int | None = None
    version: int = 0
    mutated: bool = False


@dataclass(eq=False)
class Alias:
    """A fake tensor seen by the tracer: its root, the view chain from it, and its current node."""

    tensor: torch.Tensor
    root: Root
    chain: tuple[ViewStep, ...]
    node: fx.Node
    version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


EmitFn = Callable[[Any, tuple[Any, ...], dict[str, Any]], tuple[fx.Node, Any]]


def replay(emit: EmitFn, step: ViewStep, node: fx.Node, val: torch.Tensor) -> tuple[fx.Node, Any]:
    """Emit ``step`` on ``node`` (with fake value ``val``); returns the new node and its fake value."""
    out_node, out_val = emit(step.op, (node, *step.args), dict(step.kwargs))
    if step.index is not None:
        return emit(operator.getitem, (out_node, step.index), {})[0], out_val[step.index]
    return out_node, out_val


def _contiguous(emit: EmitFn, node: fx.Node, val: torch.Tensor) -> tuple[fx.Node, torch.Tensor]:
    if val.is_contiguous():
        return node, val
    return emit(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})


def _reshape_back(emit: EmitFn, base_val: torch.Tensor, src: fx.Node, src_val: torch.Tensor) -> fx.Node:
    src, _ = _contiguous(emit, src, src_val)
    return emit(aten.view.default, (src, list(base_val.shape)), {})[0]


def _split_start(step: ViewStep, base_val: torch.Tensor) -> tuple[int, int, int]:
    a = step.args
    dim = a[1] if len(a) > 1 else dict(step.kwargs).get("dim", 0)
    dim = dim % base_val.dim()
    assert step.index is not None
    if step.op is aten.split.Tensor:
        start = step.index * a[0]
        end = min(start + a[0], base_val.shape[dim])
    else:  # split_with_sizes
        start = sum(a[0][: step.index])
        end = start + a[0][step.index]
    return dim, start, end


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: a clone keeps its strides, so storage offsets carry over."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def inverse(emit: EmitFn, step: ViewStep, base: fx.Node, base_val: torch.Tensor,
            view_val: torch.Tensor, src: fx.Node, src_val: torch.Tensor) -> fx.Node:
    """A node holding ``base`` with its ``step`` view replaced by ``src``."""
    op, a, kw = step.op, step.args, dict(step.kwargs)
    if op in (aten.alias.default, aten.detach.default, aten.lift_fresh.default):
        return src
    if op is aten.slice.Tensor:
        return emit(aten.slice_scatter.default, (base, src, *a), kw)[0]
    if op is aten.select.int:
        return emit(aten.select_scatter.default, (base, src, *a), kw)[0]
    if op is aten.diagonal.default:
        return emit(aten.diagonal_scatter.default, (base, src, *a), kw)[0]
    if op is aten.unbind.int:
        dim = a[0] if a else kw.get("dim", 0)
        return emit(aten.select_scatter.default, (base, src, dim, step.index), {})[0]
    if op in (aten.split.Tensor, aten.split_with_sizes.default):
        dim, start, end = _split_start(step, base_val)
        return emit(aten.slice_scatter.default, (base, src, dim, start, end, 1), {})[0]
    if op in (aten.view.default, aten._reshape_alias.default, aten.unsqueeze.default,
              aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten._unsafe_view.default):
        return _reshape_back(emit, base_val, src, src_val)
    if op is aten.permute.default:
        dims = [d % base_val.dim() for d in a[0]]
        inv = [dims.index(i) for i in range(len(dims))]
        return emit(aten.permute.default, (src, inv), {})[0]
    if op is aten.transpose.int:
        return emit(aten.transpose.int, (src, *a), kw)[0]
    if op is aten.t.default:
        return emit(aten.t.default, (src,), {})[0]
    if op is aten.view.dtype:
        return emit(aten.view.dtype, (src, base_val.dtype), {})[0]
    if op is aten._conj.default:  # the conjugate bit: the base holds the conjugate of what the view shows
        return emit(aten.conj_physical.default, (src,), {})[0]
    if op is aten._neg_view.default:
        return emit(aten.neg.default, (src,), {})[0]
    if op is aten.view_as_real.default:
        return emit(aten.view_as_complex.default, (src,), {})[0]
    if op is aten.view_as_complex.default:
        return emit(aten.view_as_real.default, (src,), {})[0]
    # Anything else: write through the view's strides on a dense copy of the base.
    if not is_dense(base_val):
        raise NotImplementedError(f"mutation through view op {op} of a non-dense tensor")
    if view_val.dtype != base_val.dtype:  # strides and offsets count other elements
        raise NotImplementedError(f"mutation through view op {op} from {base_val.dtype} to {view_val.dtype}")
    offset = view_val.storage_offset() - base_val.storage_offset()
    return emit(aten.as_strided_scatter.default,
                (base, src, list(view_val.shape), list(view_val.stride()), offset), {})[0]
