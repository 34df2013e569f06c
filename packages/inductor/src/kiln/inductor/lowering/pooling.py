"""Lowering rules for pooling windows: max_pool2d as a pointwise max over its unrolled window.

A 3x3 max pool as an ATen fallback cost ResNet-50 on CPU about a fifth of its step (it also computes
the indices nobody reads in inference); unrolled, it is one vectorised loop that fuses with its
producer's epilogue.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import sympy
import torch
from torch import fx

from ..ir import Constant, Expr, IndexValue, cast, index_vars, op
from .common import Rule, upcast
from .context import LoweringContext, NotLowered
from .values import Lazy, TensorValue, value_at

RULES: dict[str, Rule] = {}

MAX_WINDOW = 49  # unrolled loads per output; bigger windows stay ATen fallbacks


def _pair(v: int | Sequence[int], default: Sequence[int] | None = None) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = list(v)
    if not v and default is not None:
        return (int(default[0]), int(default[1]))
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _indices_used(node: fx.Node) -> bool:
    return any(not (u.target is operator.getitem and u.args[1] == 0) for u in node.users)


def _in_bounds(pos: sympy.Expr, size: int, lo_ok: bool, hi_ok: bool) -> list[Expr]:
    conds: list[Expr] = []
    if not lo_ok:
        conds.append(op("ge", IndexValue(pos, torch.int64), Constant(0, torch.int64), dtype=torch.bool))
    if not hi_ok:
        conds.append(op("lt", IndexValue(pos, torch.int64), Constant(size, torch.int64), dtype=torch.bool))
    return conds


def _max_pool2d(ctx: LoweringContext, node: fx.Node, x: TensorValue, kernel_size: Sequence[int],
                stride: Sequence[int] = (), padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                ceil_mode: bool = False) -> tuple:
    if _indices_used(node):
        raise NotLowered("max_pool2d indices are used (training): the ATen kernel computes them")
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > MAX_WINDOW:
        raise NotLowered(f"max_pool2d window {kh}x{kw} is larger than {MAX_WINDOW} elements")
    if not x.dtype.is_floating_point:
        raise NotLowered("max_pool2d of integer tensors")
    if not all(isinstance(s, sympy.Integer) for s in x.shape):
        raise NotLowered("max_pool2d with symbolic sizes")  # through ATen, correct for every size
    shape = tuple(node.meta["val"][0].shape)
    n = len(shape)
    H, W = int(x.shape[-2]), int(x.shape[-1])
    OH, OW = int(shape[-2]), int(shape[-1])
    d = node.meta["val"][0].dtype
    cd = upcast(d)
    iv = list(index_vars("i", n))
    oh, ow = iv[-2], iv[-1]
    ninf = Constant(float("-inf"), cd)
    acc: Expr | None = None
    for a in range(kh):
        for b in range(kw):
            h = oh * sh - ph + a * dh
            w = ow * sw - pw + b * dw
            conds = _in_bounds(h, H, -ph + a * dh >= 0, (OH - 1) * sh - ph + a * dh < H)
            conds += _in_bounds(w, W, -pw + b * dw >= 0, (OW - 1) * sw - pw + b * dw < W)
            v: Expr = cast(value_at(x, iv[:-2] + [h, w]), cd)
            if conds:
                c = conds[0]
                for more in conds[1:]:
                    c = op("logical_and", c, more, dtype=torch.bool)
                v = op("where", c, v, ninf, dtype=cd)
            # maximum keeps NaN from its first operand: a NaN anywhere in the window wins, as in ATen
            acc = v if acc is None else op("maximum", v, acc, dtype=cd)
    assert acc is not None
    out = tuple(sympy.Integer(int(s)) for s in shape)
    unused = Lazy(out, torch.int64, Constant(0, torch.int64))  # never read: checked above
    return (Lazy(out, d, cast(acc, d)), unused)


RULES["aten.max_pool2d_with_indices.default"] = _max_pool2d
