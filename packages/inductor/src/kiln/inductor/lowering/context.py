"""LoweringContext: what lowering rules read and write (passed explicitly, never a global)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import sympy
import torch

from kiln.graph import log

from ..ir import (
    ComputedBuffer,
    ExternKernel,
    InputBuffer,
    Layout,
    Node,
    Pointwise,
    contiguous_strides,
    index_vars,
    is_dense,
    reads,
    size,
)
from ..options import InductorOptions
from .values import Lazy, Strided, TensorValue, as_lazy


class NotLowered(Exception):
    """A lowering rule cannot handle these arguments; the op falls back to ATen (and says so)."""


@dataclass
class LoweringContext:
    options: InductorOptions
    device: str = "cpu"  # where the generated kernels run (the backend's device); other nodes run in ATen
    inputs: list[InputBuffer] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    layouts: dict[str, Layout] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    seed_buffer: str | None = None
    # next unused offset of the counter-based generator: a sum of element counts, symbolic when sizes are
    rng_offset: sympy.Expr = sympy.Integer(0)
    storage_offsets: dict[str, int] = field(default_factory=dict)  # input buffer -> its storage_offset
    origin: str = ""  # the ATen op being lowered, recorded on the buffers it makes
    _names: itertools.count = field(default_factory=itertools.count)
    _cse: dict[tuple[object, object], Strided] = field(default_factory=dict)

    def new_name(self, prefix: str = "buf") -> str:
        return f"{prefix}{next(self._names)}"

    def add(self, node: Node) -> None:
        self.nodes.append(node)
        if isinstance(node, ComputedBuffer):
            self.layouts[node.name] = node.layout
        else:
            assert isinstance(node, ExternKernel)
            for o in node.outputs:
                self.layouts[o.buffer] = o.layout

    def computed(self, layout: Layout, data: object) -> Strided:
        key = (layout, data)
        hit = self._cse.get(key)
        if hit is not None:  # the same loop over the same inputs was already lowered
            return hit
        name = self.new_name()
        self.add(ComputedBuffer(name, layout, data, (self.origin,) if self.origin else ()))  # type: ignore[arg-type]
        value = Strided(name, layout.shape, layout.stride, layout.offset, layout.dtype)
        self._cse[key] = value
        return value

    def copy(self, v: Strided) -> Strided:
        """``v`` stored into a buffer of its own (never one ``computed`` already made: a graph output
        that must not share memory with another), with its strides when they are dense."""
        st = v.stride if is_dense(v.shape, v.stride) else contiguous_strides(v.shape)
        layout = Layout(v.shape, tuple(st), v.dtype)
        name = self.new_name()
        self.add(ComputedBuffer(name, layout, Pointwise(v.shape, as_lazy(v).body),
                                (self.origin,) if self.origin else ()))  # type: ignore[arg-type]
        return Strided(name, layout.shape, layout.stride, layout.offset, layout.dtype)

    def realize(self, v: TensorValue, stride: tuple[sympy.Expr, ...] | None = None) -> Strided:
        """Store a lazy value into a new buffer (with ``stride`` when given, else contiguous)."""
        if isinstance(v, Strided):
            return v
        st = stride if stride is not None and is_dense(v.shape, stride) else contiguous_strides(v.shape)
        if v.view_of is not None and _same_layout(v.shape, st, contiguous_strides(v.shape)):
            # a reshaped lazy value: its source is stored (contiguous) in its own iteration space and
            # this is a free view of it. Same bytes, but the loop fuses with the source's producer (a
            # LayerNorm over [B, L | C] writing the [B*L, C] operand of the next matmul: one kernel)
            base = self.realize(v.view_of)
            if base.offset == 0 and _same_layout(base.shape, base.stride, contiguous_strides(base.shape)):
                return Strided(base.buffer, v.shape, contiguous_strides(v.shape), base.offset, v.dtype)
        layout = Layout(v.shape, tuple(st), v.dtype)
        return self.computed(layout, Pointwise(v.shape, v.body))

    def maybe_realize(self, v: TensorValue, n_users: int,
                      stride: tuple[sympy.Expr, ...] | None = None) -> TensorValue:
        """Realize a lazy value read by several consumers unless it is cheap to recompute (into
        ``stride`` when given: a channels-last activation stays channels-last)."""
        if not isinstance(v, Lazy):
            return v
        body_size = size(v.body, limit=8 * self.options.inline_max_size)  # exact up to the larger bound
        shared = n_users > 1 and (body_size > self.options.inline_max_size
                                  or _full_reads(v) > self.options.inline_max_reads)
        if shared or body_size > 8 * self.options.inline_max_size:
            return self.realize(v, stride)
        return v

    def seed(self) -> str:
        if self.seed_buffer is None:
            self.seed_buffer = "seed"
        return self.seed_buffer

    def perf_hint(self, msg: str) -> None:
        self.fallbacks.append(msg)
        log("perf_hints").info(msg)


def _same_layout(shape: tuple, a: tuple, b: tuple) -> bool:
    """Strides ``a`` and ``b`` address ``shape`` alike (size-1 dims' strides do not matter)."""
    return all(x == y for n, x, y in zip(shape, a, b) if n != 1)


def _full_reads(v: Lazy) -> int:
    """How many buffers ``v`` reads over its whole iteration space (broadcast reads of a bias or a
    per-row statistic are cheap to repeat and do not count)."""
    dims = {var for var, n in zip(index_vars("i", len(v.shape)), v.shape) if n != 1}
    return len({ld.buffer for ld in reads(v.body) if dims <= ld.index.free_symbols})


def dtype_of(v: object) -> torch.dtype:
    return v.dtype  # type: ignore[attr-defined,no-any-return]
