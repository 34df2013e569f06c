"""Lowering rules for ``_foreach_*`` ops (optimizer updates over many tensors) and the pointwise
composites optimizers use (addcmul, addcdiv, lerp).

A foreach op is its single-tensor rule applied per list element; the scheduler then fuses each
element's chain into one kernel, and the wrapper launches them back to back from one .so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..ir import Constant, Expr, cast, op
from .common import Rule, out_dtype, pointwise, upcast
from .context import LoweringContext, NotLowered
from .pointwise import RULES as POINTWISE
from .values import Lazy, TensorValue, is_tensor
from .views import RULES as VIEWS

RULES: dict[str, Rule] = {}
select = VIEWS["aten.select.int"]


@dataclass
class ElementNode:
    """Stands in for the fx node of one element of a foreach op (rules read ``meta`` and ``name``)."""

    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    target: Any = None


def _c(v: float, d: torch.dtype) -> Expr:
    return cast(Constant(v, torch.float64 if isinstance(v, float) else torch.int64), d)


def _addcmul(div: bool):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, t1: TensorValue, t2: TensorValue,
             value: Any = 1) -> Lazy:
        cd = upcast(out_dtype(node))
        if is_tensor(value):  # a foreach ``.Tensor`` overload's element (its ``scalars[k]``, 0-d)
            return pointwise(node, [x, t1, t2, value], lambda a, b, c, v: op("add", a, op(
                "mul", op("truediv" if div else "mul", b, c, dtype=cd), v, dtype=cd), dtype=cd), cd)

        def f(a: Expr, b: Expr, c: Expr) -> Expr:
            prod = op("truediv" if div else "mul", b, c, dtype=cd)
            if value != 1:
                prod = op("mul", prod, _c(value, cd), dtype=cd)
            return op("add", a, prod, dtype=cd)
        return pointwise(node, [x, t1, t2], f, cd)
    return rule


RULES["aten.addcmul.default"] = _addcmul(False)
RULES["aten.addcdiv.default"] = _addcmul(True)


def _lerp(ctx: LoweringContext, node: fx.Node, x: TensorValue, end: TensorValue, weight: Any) -> Lazy:
    cd = upcast(out_dtype(node))
    return pointwise(node, [x, end, weight], lambda a, b, w: op(
        "add", a, op("mul", w, op("sub", b, a, dtype=cd), dtype=cd), dtype=cd), cd)


RULES["aten.lerp.Scalar"] = _lerp
RULES["aten.lerp.Tensor"] = _lerp


def _element(ctx: LoweringContext, node: fx.Node, scalars: Any, k: int) -> TensorValue:
    """``scalars[k]`` (0-d) of a foreach ``.Tensor`` overload's 1-d ``scalars`` tensor: ATen reads it as
    a list of numbers, one per list element."""
    if not is_tensor(scalars) or len(scalars.shape) != 1:
        raise NotLowered("a foreach op's scalars tensor is not 1-d")
    el = ElementNode(f"{node.name}_scalars_{k}", {"val": torch.empty((), dtype=scalars.dtype, device="meta")})
    return select(ctx, el, scalars, 0, k)  # type: ignore[arg-type]


def _foreach(single: str, tensor_scalars: bool = False):
    """The rule of a foreach op: ``single``'s rule per list element. ``tensor_scalars``: its last
    argument is a 1-d tensor whose k-th element is the k-th list element's scalar."""
    def rule(ctx: LoweringContext, node: fx.Node, *args: Any, **kwargs: Any) -> tuple:
        base = RULES.get(single) or POINTWISE.get(single)
        if base is None:
            raise NotLowered(f"no rule for {single}")
        vals = node.meta.get("val")
        if not isinstance(vals, (list, tuple)):
            raise NotLowered("foreach without list meta")
        outs = []
        for k, v in enumerate(vals):
            el = ElementNode(f"{node.name}_{k}", {"val": v})
            el_args = [a[k] if isinstance(a, (list, tuple)) else a for a in args]
            if tensor_scalars:
                el_args[-1] = _element(ctx, node, args[-1], k)
            el_kwargs = {n: (a[k] if isinstance(a, (list, tuple)) else a) for n, a in kwargs.items()}
            outs.append(base(ctx, el, *el_args, **el_kwargs))
        return tuple(outs)
    return rule


_FOREACH = {
    "add": ("List", "Scalar", "Tensor", "ScalarList"), "sub": ("List", "Scalar", "ScalarList"),
    "mul": ("List", "Scalar", "Tensor", "ScalarList"), "div": ("List", "Scalar", "Tensor", "ScalarList"),
    "maximum": ("List",), "minimum": ("List",), "clamp_min": ("Scalar",), "clamp_max": ("Scalar",),
    "pow": ("Scalar", "List"),
}
_SINGLE = {"add": "aten.add.Tensor", "sub": "aten.sub.Tensor", "mul": "aten.mul.Tensor", "div": "aten.div.Tensor",
           "maximum": "aten.maximum.default", "minimum": "aten.minimum.default",
           "clamp_min": "aten.clamp_min.default", "clamp_max": "aten.clamp_max.default",
           "pow": "aten.pow.Tensor_Scalar"}
for _op, _ovs in _FOREACH.items():
    for _ov in _ovs:
        RULES[f"aten._foreach_{_op}.{_ov}"] = _foreach(_SINGLE[_op])
RULES["aten._foreach_pow.List"] = _foreach("aten.pow.Tensor_Tensor")
for _op in ("sqrt", "exp", "neg", "reciprocal", "abs", "sign", "log", "sigmoid", "tanh", "rsqrt"):
    RULES[f"aten._foreach_{_op}.default"] = _foreach(f"aten.{_op}.default")
for _ov in ("Scalar", "ScalarList"):
    RULES[f"aten._foreach_addcmul.{_ov}"] = _foreach("aten.addcmul.default")
    RULES[f"aten._foreach_addcdiv.{_ov}"] = _foreach("aten.addcdiv.default")
    RULES[f"aten._foreach_lerp.{_ov}"] = _foreach("aten.lerp.Scalar")
# torch.optim's foreach Adam/AdamW/NAdam under a compiler: the step sizes are one stacked tensor
RULES["aten._foreach_addcmul.Tensor"] = _foreach("aten.addcmul.default", tensor_scalars=True)
RULES["aten._foreach_addcdiv.Tensor"] = _foreach("aten.addcdiv.default", tensor_scalars=True)
RULES["aten._foreach_lerp.List"] = _foreach("aten.lerp.Tensor")
RULES["aten._foreach_copy.default"] = _foreach("aten.copy.default")
