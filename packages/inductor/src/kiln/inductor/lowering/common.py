"""Shared helpers of lowering rules: output metadata, type promotion, the pointwise builder."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch import fx

from ..ir import (
    Constant,
    Expr,
    IndexExpr,
    IndexValue,
    SymScalar,
    as_index,
    cast,
    index_vars,
    is_symbolic,
    sym_expr,
)
from .context import LoweringContext, NotLowered
from .values import Lazy, TensorValue, broadcast_at, is_tensor

Rule = Callable[..., Any]

LOW_PRECISION = (torch.bfloat16, torch.float16)


def upcast(d: torch.dtype) -> torch.dtype:
    """bf16/fp16 are computed in fp32."""
    return torch.float32 if d in LOW_PRECISION else d


def meta(node: fx.Node) -> Any:
    v = node.meta.get("val")
    if v is None:
        raise NotLowered(f"node {node.name} has no meta['val']")
    return v


def out_shape(node: fx.Node) -> tuple[IndexExpr, ...]:
    v = meta(node)
    return tuple(_dim(s) for s in v.shape)


def out_stride(node: fx.Node) -> tuple[IndexExpr, ...]:
    return tuple(_dim(s) for s in meta(node).stride())


def out_dtype(node: fx.Node) -> torch.dtype:
    return meta(node).dtype  # type: ignore[no-any-return]


def _dim(s: object) -> IndexExpr:
    if is_symbolic(s):
        return sym_expr(s)
    return as_index(s)


@functools.cache
def _probe(dtype: torch.dtype, dim: bool) -> torch.Tensor:
    return torch.empty((1,) if dim else (), dtype=dtype)


def promote(*args: object) -> torch.dtype:
    """torch's result type of ``args`` (values and Python scalars), computed on tiny probe tensors."""
    probes: list[Any] = []
    for a in args:
        if is_tensor(a):
            probes.append(_probe(a.dtype, len(a.shape) > 0))  # type: ignore[union-attr]
        elif isinstance(a, (bool, int, float)):
            probes.append(a)
        elif isinstance(a, sympy.Expr):  # a symbolic int (a size used as a value)
            probes.append(1)
        elif isinstance(a, SymScalar):  # a symbolic float: promotes as a Python float does
            probes.append(1.0)
        else:
            raise NotLowered(f"cannot promote {type(a).__name__}")
    if len(probes) == 1:
        p = probes[0]
        return p.dtype if isinstance(p, torch.Tensor) else torch.tensor(p).dtype
    dt = torch.result_type(probes[0], probes[1])
    for p in probes[2:]:
        dt = torch.promote_types(dt, torch.result_type(p, p) if isinstance(p, torch.Tensor) else
                                 torch.result_type(_probe(dt, True), p))
    return dt


def operand(a: object, idx: Sequence[IndexExpr], dtype: torch.dtype) -> Expr:
    if is_tensor(a):
        return broadcast_at(a, idx, dtype)  # type: ignore[arg-type]
    return scalar_value(a, dtype)


def scalar_value(a: object, dtype: torch.dtype) -> Expr:
    """A Python scalar argument as a value of ``dtype``: a constant, a symbolic int (the kernel reads
    the size argument) or a symbolic float (its float64 expression over size arguments, then cast
    to ``dtype`` as ATen casts a double scalar: ir/scalars.py)."""
    if isinstance(a, (bool, int, float)):
        return cast(Constant(a, _scalar_dtype(a)), dtype)
    if isinstance(a, sympy.Expr):
        return cast(IndexValue(a, torch.int64), dtype)
    if isinstance(a, SymScalar):
        return cast(a.value, dtype)
    if isinstance(a, (torch.SymInt, torch.SymFloat)):
        raise NotLowered("symbolic scalars are not supported yet")
    raise NotLowered(f"unsupported operand {type(a).__name__}")


def _scalar_dtype(a: bool | int | float) -> torch.dtype:
    if isinstance(a, bool):
        return torch.bool
    return torch.int64 if isinstance(a, int) else torch.float64


def pointwise(node: fx.Node, args: Sequence[object], fn: Callable[..., Expr], compute: torch.dtype,
              dtype: torch.dtype | None = None) -> Lazy:
    """A lazy value of the node's shape: ``fn`` over operands broadcast and cast to ``compute``."""
    shape = out_shape(node)
    d = dtype if dtype is not None else out_dtype(node)
    idx = index_vars("i", len(shape))
    body = fn(*(operand(a, idx, compute) for a in args))
    return Lazy(shape, d, cast(body, d))


def tensor_args(args: Sequence[object]) -> list[TensorValue]:
    return [a for a in args if is_tensor(a)]  # type: ignore[misc]


def require_cpu(node: fx.Node, ctx: LoweringContext) -> None:
    v = meta(node)
    if isinstance(v, torch.Tensor) and v.device.type not in ("cpu", "cuda"):
        raise NotLowered(f"device {v.device} is not handled by the C++ or Triton backends")


def size_value(n: IndexExpr, dtype: torch.dtype) -> Expr:
    """A size as a value of ``dtype``: a constant when static, else the kernel's size argument."""
    if isinstance(n, (int, sympy.Integer)):
        return Constant(float(n) if dtype.is_floating_point else int(n), dtype)
    return cast(IndexValue(n, torch.int64), dtype)


def zero() -> sympy.Expr:
    return sympy.Integer(0)


def symbolic_start(node: fx.Node, position: int, start: IndexExpr, dim: int) -> IndexExpr:
    """A symbolic slice start (argument ``position`` of ``node``, over dim ``dim`` of its first argument)
    as torch normalizes it: ``x[int(f):]`` with f = -1.5 counts from the end, and ``x[n - 6:]`` at n = 2
    clamps to 0 (see ``negative_at_example``)."""
    if not negative_at_example(node, position, start):
        return start
    size = meta(node.args[0]).shape[dim]  # type: ignore[arg-type]
    if negative_at_example(node, position, start, size):
        return sympy.Integer(0)
    return start + _dim(size)


def negative_at_example(node: fx.Node, position: int, value: object, plus: Any = 0) -> bool:
    """Whether a symbolic start or index (argument ``position`` of ``node``), plus ``plus`` (an int or
    SymInt), is negative: sizes never are, but ``n - 6`` or a size rounded from a float argument
    (``int(f)``) may be. Asked of the ShapeEnv: the example's answer, as a size guard where the trace
    had not guarded it already (torch's slice asks, its slice_scatter does not), which the wrapper
    checks per call."""
    if not isinstance(value, sympy.Expr) or value.is_nonnegative is True:
        return False
    arg = node.args[position] if len(node.args) > position else None
    v = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    if not isinstance(v, torch.SymInt):
        raise NotLowered(f"a symbolic start or index ({value}) without a SymInt to ask its sign")
    return bool(v + plus < 0)
