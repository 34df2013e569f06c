"""Size buckets for CUDA graphs of dynamic graphs (``InductorOptions.cudagraph_sizes``).

A graph compiled with a symbolic leading size ``s`` (a batch, a number of tokens) is called with that
dim padded up to the next bucket (``[1, 2, 4, 8, ...]``) and its outputs sliced back, as vLLM does
with its capture sizes: reduce-overhead then records one CUDA graph per bucket instead of one per size.
Sizes above the largest bucket run unpadded (one graph per size, up to the recording cap).

Note: padding is only correct when rows of ``s`` never meet: no reduction, scan or scatter over
``s``, every load of an ``s``-sized buffer reads the row its loop point computes (dim 0 at ``i0``),
matmuls and attention with ``s`` only as a row/batch dim, no other extern or fallback touching it,
and ``s`` only ever a whole leading dim. ``plan_buckets`` checks this on the loop IR and refuses
with the reason otherwise (the graph then records per size).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from kiln.graph import log

from .ir import (
    ComputedBuffer,
    ExternKernel,
    Layout,
    ListArg,
    Load,
    LoopProgram,
    Pointwise,
    Reduction,
    TensorRef,
    index_var,
    loop_bodies,
    walk,
)

# externs whose operands may carry the bucketed size as a row (M) / batch dim: (arg, dim) pairs where
# it may appear; anywhere else in their operands refuses
_ROWWISE = {
    "aten.mm.default": {(0, 0)},
    "aten.addmm.default": {(0, 0), (1, 0)},
    "aten.bmm.default": {(0, 0), (1, 0), (0, 1)},
    "aten.convolution.default": {(0, 0)},
    "aten._scaled_dot_product_flash_attention_for_cpu.default": {(0, 0), (1, 0), (2, 0)},
    "aten._scaled_dot_product_efficient_attention.default": {(0, 0), (1, 0), (2, 0)},
    "aten._scaled_dot_product_flash_attention.default": {(0, 0), (1, 0), (2, 0)},
    "aten._scaled_dot_product_cudnn_attention.default": {(0, 0), (1, 0), (2, 0)},
}


@dataclass(frozen=True, slots=True)
class BucketPlan:
    symbol: str
    sizes: tuple[int, ...]  # sorted buckets
    inputs: tuple[int, ...]  # positions of the inputs whose dim 0 is the symbol
    outputs: tuple[int, ...]  # positions of the outputs whose dim 0 is the symbol
    source: str  # where the symbol is read (``arg0.size(0)``)


def plan_buckets(p: LoopProgram, sizes: Sequence[int]) -> tuple[BucketPlan | None, str]:
    """The bucket plan for ``p``'s leading symbolic size, or None and why padding would not be safe."""
    lead = next((b for b in p.inputs if b.layout.shape and isinstance(b.layout.shape[0], sympy.Symbol)), None)
    if lead is None:
        return None, "no input has a symbolic leading dim"
    s = lead.layout.shape[0]
    assert isinstance(s, sympy.Symbol)
    layouts = p.layouts()
    reason = _leading_only(s, layouts) or _rowwise(p, s, layouts)
    if p.scalar_inputs:
        reason = reason or "the graph takes symbolic int inputs (padding would not update them)"
    if any(not b.layout.is_contiguous for b in p.inputs if b.layout.shape and b.layout.shape[0] == s):
        reason = reason or "a padded input is not contiguous (the padded copy would be)"
    if reason:
        return None, reason
    src = next((z.source for z in p.sizes if z.symbol == s.name), "")
    ins = tuple(b.position for b in p.inputs if b.layout.shape and b.layout.shape[0] == s)
    outs = tuple(k for k, o in enumerate(p.outputs) if isinstance(o, TensorRef) and o.shape and o.shape[0] == s)
    return BucketPlan(s.name, tuple(sorted(set(int(x) for x in sizes))), ins, outs, src), ""


def _leading_only(s: sympy.Symbol, layouts: dict[str, Layout]) -> str:
    for name, lay in layouts.items():
        for k, n in enumerate(lay.shape):
            if s in sympy.sympify(n).free_symbols and (k != 0 or n != s):
                return f"{s} is not only a whole leading dim ({name}: {lay.as_text()})"
    return ""


def _rowwise(p: LoopProgram, s: sympy.Symbol, layouts: dict[str, Layout]) -> str:
    i0 = index_var("i", 0)
    for n in p.nodes:
        if isinstance(n, ExternKernel):
            why = _extern_rowwise(n, s)
            if why:
                return why
            continue
        assert isinstance(n, ComputedBuffer)
        d = n.data
        rows = bool(d.ranges) and d.ranges[0] == s if isinstance(d, (Pointwise, Reduction)) else False
        if not isinstance(d, (Pointwise, Reduction)):
            return f"{n.name} is a {type(d).__name__.lower()} (its rows may meet)"
        if isinstance(d, Reduction) and any(s in sympy.sympify(r).free_symbols for r in d.reduction_ranges):
            return f"{n.name} reduces over {s}"
        for body in loop_bodies(d):
            for e in walk(body):
                if not isinstance(e, Load):
                    continue
                lay = layouts[e.buffer]
                padded = bool(lay.shape) and lay.shape[0] == s
                coeff = sympy.expand(e.index).coeff(i0)
                if padded and not (rows and coeff == lay.stride[0] and not e.indirect
                                   and i0 not in sympy.expand(e.index - coeff * i0).free_symbols):
                    return f"{n.name} reads {e.buffer} at another row than its own"
                if not padded and rows and i0 in e.index.free_symbols:
                    return f"{n.name} indexes {e.buffer} by its {s} row"
    return ""


def _mentions(a: object, s: sympy.Symbol) -> bool:
    if isinstance(a, ListArg):
        return any(_mentions(x, s) or isinstance(x, TensorRef) for x in a.items)
    v = getattr(a, "value", None)
    return isinstance(v, sympy.Basic) and s in v.free_symbols


def _extern_rowwise(n: ExternKernel, s: sympy.Symbol) -> str:
    allowed = _ROWWISE.get(n.target, set())
    if any(_mentions(v, s) or isinstance(v, TensorRef) for _, v in n.kwargs):
        return f"{n.kind} {n.target} takes {s} or a tensor as a keyword argument"
    for k, a in enumerate(n.args):
        if not isinstance(a, TensorRef):
            if _mentions(a, s):
                return f"{n.kind} {n.target} takes {s} (or a list of tensors) as an argument"
            continue
        for dim, size in enumerate(a.shape):
            if s in sympy.sympify(size).free_symbols and (k, dim) not in allowed:
                return f"{n.kind} {n.target} uses {s} in dim {dim} of operand {k}"
    return ""


class BucketedCall:
    """``fn`` called with the bucketed dim padded up to its bucket; its outputs sliced back."""

    __slots__ = ("fn", "plan", "_over")

    def __init__(self, fn: Callable[..., Any], plan: BucketPlan) -> None:
        self.fn, self.plan, self._over = fn, plan, False

    def __call__(self, *args: Any) -> tuple:
        return self.call_owned(list(args))

    def call_owned(self, args: list) -> tuple:
        plan = self.plan
        n = args[plan.inputs[0]].shape[0]
        k = bisect.bisect_left(plan.sizes, n)
        if k == len(plan.sizes):  # above the largest bucket: as it is
            if not self._over:
                self._over = True
                log("cudagraphs").info("size %s=%d is above the largest bucket %d: such sizes run unpadded",
                                       plan.symbol, n, plan.sizes[-1])
            return _call(self.fn, args)
        bucket = plan.sizes[k]
        if bucket != n:
            for i in plan.inputs:
                args[i] = _pad_rows(args[i], bucket)
        out = _call(self.fn, args)
        if bucket == n:
            return out
        return tuple(o[:n] if j in plan.outputs else o for j, o in enumerate(out))


def _call(fn: Any, args: list) -> tuple:
    call_owned = getattr(fn, "call_owned", None)
    return call_owned(args) if call_owned is not None else fn(*args)  # type: ignore[no-any-return]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: x.shape[0]] = x
    return out


def bucket_sizes(p: LoopProgram, fn: Callable[..., Any], sizes: Sequence[int], name: str) -> Callable[..., Any]:
    """``fn`` with ``sizes`` buckets when ``p`` allows padding its leading symbolic dim (else ``fn``, logged)."""
    if not sizes or not p.sizes:
        return fn
    plan, why = plan_buckets(p, sizes)
    if plan is None:
        log("cudagraphs").warning("graph %s: cudagraph_sizes not applied, CUDA graphs are recorded per size: %s",
                                  name, why)
        return fn
    log("cudagraphs").info("graph %s: %s (%s) padded up to the buckets %s", name, plan.symbol, plan.source,
                           list(plan.sizes))
    return BucketedCall(fn, plan)
