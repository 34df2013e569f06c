"""Lowering rules for scans: cumsum and cumprod along one dim (a Scan node, its own kernel)."""

from __future__ import annotations

import torch
from torch import fx

from ..ir import Layout, Scan, cast, index_vars
from .common import Rule, out_dtype, upcast
from .context import LoweringContext
from .values import TensorValue, value_at

RULES: dict[str, Rule] = {}


def _scan(scan_type: str):
    def rule(ctx: LoweringContext, node: fx.Node, x: TensorValue, dim: int, *,
             dtype: torch.dtype | None = None) -> TensorValue:
        d = out_dtype(node)
        n = len(x.shape)
        iv = index_vars("i", n)
        if n == 0:
            from .values import Lazy
            return Lazy((), d, cast(value_at(x, []), d))
        dim = dim + n if dim < 0 else dim
        body = cast(value_at(x, list(iv)), upcast(d))
        return ctx.computed(Layout.contiguous(tuple(x.shape), d), Scan(tuple(x.shape), dim, scan_type, body))
    return rule


RULES["aten.cumsum.default"] = _scan("sum")
RULES["aten.cumprod.default"] = _scan("prod")
