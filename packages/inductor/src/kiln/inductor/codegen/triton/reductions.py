"""Row-kernel bodies: persistent (whole rows in registers) and looped (accumulators across r-chunks).

Reductions over ``[XBLOCK, RBLOCK]`` tiles give ``[XBLOCK, 1]`` results. Masked lanes take the
reduction's identity. max/min propagate NaN like torch; argmax/argmin keep the first index of the
extremum (NaN counting as the extremum), via (value, index) pair reductions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...ir import KernelNode, reads
from .ops import compute_dtype, convert, tl_dtype

if TYPE_CHECKING:
    from .kernel import KernelWriter

MASK = "xmask & rmask"
FULL = "[XBLOCK, RBLOCK]"
INDEX_MAX = 2**63 - 1


def _inf(sign: str, d: torch.dtype) -> str:
    if d.is_floating_point:
        return f'float("{sign}inf")'
    info = torch.iinfo(d)
    return str(info.min if sign == "-" else info.max)


def _kind(n: KernelNode) -> str:
    """The reduction as the kernel computes it (bool max/min are any/all)."""
    rt = n.reduction_type
    if n.body.dtype == torch.bool and rt in ("max", "min"):
        return {"max": "any", "min": "all"}[rt]
    return rt


def acc_dtype(n: KernelNode) -> torch.dtype:
    rt = _kind(n)
    if rt in ("any", "all"):
        return torch.int32
    return compute_dtype(n.body.dtype)


def identity(rt: str, d: torch.dtype) -> str:
    if rt in ("sum", "any"):
        return "0"
    if rt in ("prod", "all"):
        return "1"
    if rt in ("max", "argmax"):
        return _inf("-", d)
    if rt in ("min", "argmin"):
        return _inf("", d)
    raise NotImplementedError(f"the Triton backend does not support reduction {rt!r}")


COMBINE = {"max": "_kiln_max_combine", "min": "_kiln_min_combine", "prod": "_kiln_prod_combine",
           "sum": "_kiln_sum_combine", "argmax": "_kiln_argmax_combine", "argmin": "_kiln_argmin_combine"}


def lane_reduce(rt: str, acc: str) -> str:
    """Reduce a full tile along r to ``[XBLOCK, 1]``."""
    if rt == "sum":
        return f"tl.sum({acc}, 1)[:, None]"
    if rt == "any":
        return f"(tl.max({acc}, 1)[:, None] != 0)"
    if rt == "all":
        return f"(tl.min({acc}, 1)[:, None] != 0)"
    return f"tl.reduce({acc}, 1, {COMBINE[rt]})[:, None]"


class ReductionEmitter:
    def __init__(self, w: KernelWriter) -> None:
        self.w = w

    # -- persistent -----------------------------------------------------------------------------------
    def persistent_body(self, nodes: Sequence[KernelNode]) -> None:
        w = self.w
        for n in nodes:
            if n.kind == "pointwise":
                w.emit_elementwise(n, "full" if n.role == "full" else "outer")
            elif n.kind == "reduction":
                v = self.body_value(n)
                rt, ad = _kind(n), acc_dtype(n)
                masked = w.assign(f"tl.where({MASK}, {v}, {identity(rt, ad)})")
                if rt in ("argmax", "argmin"):
                    idx = w.assign(f"tl.broadcast_to(rindex.to(tl.int64), {FULL})")
                    w.line(f"_, {n.buffer}_idx = tl.reduce(({masked}, {idx}), 1, {COMBINE[rt]})")
                    res = w.assign(f"{n.buffer}_idx[:, None]")
                    self.finish(n, res, torch.int64)
                else:
                    self.finish(n, w.assign(lane_reduce(rt, masked)), ad)
            elif n.kind == "scan":
                self.scan(n, carry=None)
            else:
                raise NotImplementedError(f"kernel {w.k.name}: node kind {n.kind!r}")

    def body_value(self, n: KernelNode) -> str:
        code, _ = self.w.value(n.body, "full")
        if _kind(n) in ("any", "all"):
            code = f"{convert(code, n.body.dtype, torch.bool)}.to(tl.int32)"
        return code

    def finish(self, n: KernelNode, res: str, res_dtype: torch.dtype) -> None:
        """Register a ``[XBLOCK, 1]`` reduction result and store it."""
        w = self.w
        if _kind(n) in ("any", "all"):
            res_dtype = torch.bool
        if res_dtype != n.dtype:
            res = w.assign(convert(res, res_dtype, n.dtype))
        w.locals[n.buffer] = (res, frozenset("x"), 0)
        w.store(n, res, "outer")

    def scan(self, n: KernelNode, carry: str | None) -> None:
        w = self.w
        code, _ = w.value(n.body, "full")
        d = compute_dtype(n.body.dtype)
        rt = n.reduction_type
        ident = "0" if rt == "sum" else "1"
        if rt not in ("sum", "prod"):
            raise NotImplementedError(f"kernel {w.k.name}: scan {rt!r}")
        masked = w.assign(f"tl.where({MASK}, {code}, tl.full([], {ident}, {tl_dtype(d)}))")
        fn = "tl.cumsum" if rt == "sum" else "tl.cumprod"
        res = w.assign(f"{fn}({masked}, 1)")
        if carry is not None:
            op = "+" if rt == "sum" else "*"
            res = w.assign(f"{res} {op} {carry}")
            w.line(f"{carry} = {carry} {op} {lane_reduce(rt, masked)}")
        if d != n.dtype:
            res = w.assign(convert(res, n.body.dtype, n.dtype))
        w.locals[n.buffer] = (res, frozenset("xr"), len(w.scopes) - 1)
        w.store(n, res, "full")

    # -- looped ---------------------------------------------------------------------------------------
    def looped_body(self, nodes: Sequence[KernelNode]) -> None:
        w = self.w
        for stage in sorted({n.stage for n in nodes}):
            group = [n for n in nodes if n.stage == stage]
            in_loop = [n for n in group if n.role == "full" or n.kind != "pointwise"]
            post: list[KernelNode] = []
            for n in group:
                if n in in_loop:
                    continue
                deps = {ld.buffer for ld in reads(n.body) if ld.buffer in w.produced}
                if post or not deps <= set(w.locals):
                    post.append(n)
                else:
                    w.emit_elementwise(n, "outer")
            accs = {n.buffer: self.init_acc(n) for n in in_loop if n.kind in ("reduction", "scan")}
            if in_loop:
                w.line(f"# stage {stage}")
                w.line("for roffset in range(0, rnumel, RBLOCK):")
                w.push_scope()
                w.r_setup("roffset + ")
                for n in in_loop:
                    if n.kind == "pointwise":
                        w.emit_elementwise(n, "full")
                    elif n.kind == "reduction":
                        self.update_acc(n, accs[n.buffer])
                    else:
                        self.scan(n, carry=accs[n.buffer])
                w.pop_scope()
                for n in in_loop:
                    if n.kind == "reduction":
                        self.finish_acc(n, accs[n.buffer])
            for n in post:
                w.emit_elementwise(n, "outer")

    def init_acc(self, n: KernelNode) -> str:
        w = self.w
        acc = w.tmp("acc")
        if n.kind == "scan":
            d = compute_dtype(n.body.dtype)
            w.line(f"{acc} = tl.full([XBLOCK, 1], {'0' if n.reduction_type == 'sum' else '1'}, {tl_dtype(d)})")
            return acc
        rt, ad = _kind(n), acc_dtype(n)
        w.line(f"{acc} = tl.full({FULL}, {identity(rt, ad)}, {tl_dtype(ad)})")
        if rt in ("argmax", "argmin"):
            w.line(f"{acc}_idx = tl.full({FULL}, {INDEX_MAX}, tl.int64)")
        return acc

    def update_acc(self, n: KernelNode, acc: str) -> None:
        w = self.w
        v = self.body_value(n)
        rt = _kind(n)
        if rt in ("argmax", "argmin"):
            w.line(f"{acc}_v, {acc}_i = {COMBINE[rt]}({acc}, {acc}_idx, {v}, rindex.to(tl.int64))")
            w.line(f"{acc} = tl.where({MASK}, {acc}_v, {acc})")
            w.line(f"{acc}_idx = tl.where({MASK}, {acc}_i, {acc}_idx)")
            return
        new = {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}", "any": f"tl.maximum({acc}, {v})",
               "all": f"tl.minimum({acc}, {v})"}.get(rt) or f"{COMBINE[rt]}({acc}, {v})"
        w.line(f"{acc} = tl.where({MASK}, {new}, {acc})")

    def finish_acc(self, n: KernelNode, acc: str) -> None:
        w = self.w
        rt = _kind(n)
        if rt in ("argmax", "argmin"):
            w.line(f"_, {acc}_res = tl.reduce(({acc}, {acc}_idx), 1, {COMBINE[rt]})")
            self.finish(n, w.assign(f"{acc}_res[:, None]"), torch.int64)
        else:
            self.finish(n, w.assign(lane_reduce(rt, acc)), acc_dtype(n))
