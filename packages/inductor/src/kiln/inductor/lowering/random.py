"""Random numbers from a counter-based generator: value = f(seed, element offset).

The wrapper draws one seed per call from torch's default generator (so torch.manual_seed makes runs
reproducible); each random op in the graph takes a distinct offset range. Values are not the same
as eager's (torch's CPU generator is a stateful Mersenne twister), only identically distributed.
"""

from __future__ import annotations

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, IndexValue, Load, cast, contiguous_strides, index_vars, op, product
from .common import Rule, out_dtype, out_shape, upcast
from .context import LoweringContext, NotLowered
from .values import Lazy, TensorValue, value_at

RULES: dict[str, Rule] = {}


def random_values(ctx: LoweringContext, shape: tuple, kind: str) -> Expr:
    """A float32 body drawing one value per element of ``shape``."""
    seed = Load(ctx.seed(), sympy.Integer(0), torch.int64)
    iv = index_vars("i", len(shape))
    flat = sum((v * s for v, s in zip(iv, contiguous_strides(shape))), sympy.Integer(0))
    base = ctx.rng_offset
    ctx.rng_offset = sympy.expand(base + (product(list(shape)) if shape else 1))
    return op(kind, seed, IndexValue(sympy.expand(flat + base), torch.int64), dtype=torch.float32)


def _rand(kind: str):
    def rule(ctx: LoweringContext, node: fx.Node, *args, **kw) -> Lazy:
        if kw.get("generator") is not None:
            raise NotLowered("an explicit torch.Generator")
        shape = out_shape(node)
        d = out_dtype(node)
        return Lazy(shape, d, cast(random_values(ctx, shape, kind), d))
    return rule


for _name in ("rand.default", "rand_like.default"):
    RULES[f"aten.{_name}"] = _rand("rand")
for _name in ("randn.default", "randn_like.default"):
    RULES[f"aten.{_name}"] = _rand("randn")


def _bernoulli(ctx: LoweringContext, node: fx.Node, x: TensorValue, p: float = 0.5, *, generator=None) -> Lazy:
    if generator is not None:
        raise NotLowered("an explicit torch.Generator")
    shape = out_shape(node)
    d = out_dtype(node)
    u = random_values(ctx, shape, "rand")
    return Lazy(shape, d, cast(op("lt", u, Constant(float(p), torch.float32), dtype=torch.bool), d))


RULES["aten.bernoulli.p"] = _bernoulli


def _dropout(ctx: LoweringContext, node: fx.Node, x: TensorValue, p: float, train: bool | None) -> tuple:
    shape = tuple(x.shape)
    iv = list(index_vars("i", len(shape)))
    d = x.dtype
    cd = upcast(d)
    if not train or p == 0:
        return (x, Lazy(shape, torch.bool, Constant(True, torch.bool)))
    u = random_values(ctx, shape, "rand")
    keep = op("lt", u, Constant(float(1 - p), torch.float32), dtype=torch.bool)
    mask = ctx.realize(Lazy(shape, torch.bool, keep))
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    kept = value_at(mask, iv)
    y = op("where", kept, op("mul", cast(value_at(x, iv), cd), Constant(scale, cd), dtype=cd), Constant(0.0, cd),
           dtype=cd)
    return (Lazy(shape, d, cast(y, d)), mask)


RULES["aten.native_dropout.default"] = _dropout
