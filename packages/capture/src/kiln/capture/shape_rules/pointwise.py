"""Shape rules for pointwise ops on contiguous floating tensors: activations (``F.relu``,
``F.hardswish``, ``torch.tanh``...), ``+ - * / **`` with a tensor or a Python number.

Why: torch runs many fake pointwise ops through Python decompositions (``hardswish`` and
``hardsigmoid`` as clamp / mul / div chains, ``inplace_op`` wrappers, ``pow``), a fake-tensor cache
miss each time a shape is new: in a MobileNetV3 warm start ``hardswish_`` and ``hardsigmoid`` alone
were about a quarter of the fake-dispatch time of capture.

The result of a pointwise op on tensors with the standard contiguous strides of their shapes is a
new contiguous tensor of the broadcast shape with the inputs' dtype (one floating dtype, Python
numbers do not promote it); an in-place op returns its input, with its version counter bumped as
the op would. Each rule returns ``None`` -- the ordinary path -- for anything else: other layouts
(where TensorIterator's output strides follow rules of their own), mixed dtypes, integer or bool
tensors, 0-dim tensors (they promote differently), symbolic sizes, keyword arguments other than
``inplace`` / ``approximate``, inference mode and autocast, and an in-place op autograd would see.
A test checks every rule against the ordinary path over many argument sets.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from .functions import _autocast_on, contiguous_strides, fresh_contiguous

PointwiseRule = Callable[[tuple, dict], Any]
_increment_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)


def _contiguous_float(t: Any) -> bool:
    if type(t) is not FakeTensor or t.layout is not torch.strided or not t.is_floating_point() or t.dim() == 0:
        return False
    shape, stride = t.shape, t.stride()
    if any(type(s) is not int for s in shape) or any(type(s) is not int for s in stride):
        return False
    return stride == contiguous_strides(shape)


def _ok_mode() -> bool:
    return not torch.is_inference_mode_enabled() and not _autocast_on()


def _in_place(x: Any) -> Any:
    """The in-place op's result (its input), versioned as the op would; None if autograd cares."""
    if _increment_version is None or (x.requires_grad and torch.is_grad_enabled()) or x._is_view():
        return None  # autograd checks (leaf, view + in-place rebase) belong to the ordinary path
    _increment_version(x)
    return x


def _unary(inplace_pos: int | None, extra: dict[str, tuple] | None = None) -> PointwiseRule:
    """A rule for ``fn(input, [inplace])``; ``extra``: keyword -> allowed values (F.gelu's
    ``approximate``)."""
    allowed = {"input"} | ({"inplace"} if inplace_pos is not None else set()) | set(extra or ())

    def rule(args: tuple, kwargs: dict) -> Any:
        if not args or not kwargs.keys() <= allowed or not _ok_mode():
            return None
        x = args[0]
        if "input" in kwargs or not _contiguous_float(x):
            return None
        inplace = False
        if inplace_pos is not None:
            if len(args) > inplace_pos + 1:
                return None
            inplace = args[inplace_pos] if len(args) > inplace_pos else kwargs.get("inplace", False)
            if type(inplace) is not bool:
                return None
        elif len(args) > 1:
            return None
        for name, values in (extra or {}).items():
            if name in kwargs and kwargs[name] not in values:
                return None
        if inplace:
            return _in_place(x)
        return fresh_contiguous(tuple(x.shape), x, (x,))
    return rule


def _binary(args: tuple, kwargs: dict) -> Any:
    """``a (op) b`` for a tensor and a tensor or a Python int/float (either side)."""
    if len(args) != 2 or kwargs or not _ok_mode():
        return None
    tensors = [a for a in args if type(a) is FakeTensor]
    if not tensors or any(not _contiguous_float(t) for t in tensors):
        return None
    x = tensors[0]
    if any(t.dtype != x.dtype or t.device != x.device for t in tensors):
        return None
    if any(type(a) is not FakeTensor and type(a) not in (int, float) for a in args):
        return None
    try:
        shape = torch.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    except RuntimeError:
        return None  # torch's error on the ordinary path
    return fresh_contiguous(tuple(shape), x, tuple(tensors))


def _tensor_base(args: tuple, kwargs: dict) -> Any:
    """``pow``: a tensor base (a number base to a tensor power promotes differently)."""
    return _binary(args, kwargs) if args and type(args[0]) is FakeTensor else None


# id(function or operator) -> rule(args, kwargs)
FAST_POINTWISE: dict[int, PointwiseRule] = {
    **{id(f): _unary(1) for f in (F.relu, F.hardswish, F.hardsigmoid, F.silu, F.relu6)},
    id(F.gelu): _unary(None, {"approximate": ("none", "tanh")}),
    **{id(f): _unary(None) for f in (torch.tanh, torch.sigmoid, torch.rsqrt, torch.exp, torch.relu,
                                     torch.neg, operator.neg, torch.sqrt, F.sigmoid, F.tanh)},
    **{id(f): _binary for f in (operator.add, operator.sub, operator.mul, operator.truediv)},
    id(operator.pow): _tensor_base,
}
