"""kiln's primitive operators: the ``kiln_prims`` torch.library namespace.

Elementwise prims take operands of one shape and one dtype (``broadcast_in_dim`` and
``convert_element_type`` make broadcasting and promotion explicit); reductions take explicit dims and
drop them; views are ``broadcast_in_dim``/``reshape``/``permute``/``slice``/``squeeze``/``as_strided``.
Ops a backend calls as a whole (matmul, convolution, attention, sort, pooling, random, gather/scatter)
are "extern" prims: ``kiln_prims.<aten name>`` with the ATen schema. Each prim has an eager kernel
(CompositeExplicitAutograd, so CPU and CUDA) and a fake/meta kernel, both written over ATen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
LIB = torch.library.Library("kiln_prims", "DEF")  # noqa: TID251 - the one definition site

UNARY = """abs neg exp expm1 log log1p log2 log10 sin cos tan asin acos atan sinh cosh tanh asinh
acosh atanh sqrt rsqrt reciprocal erf floor ceil round trunc sign bitwise_not""".split()
BINARY = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "pow": aten.pow.Tensor_Tensor,
    "maximum": aten.maximum.default, "minimum": aten.minimum.default, "atan2": aten.atan2.default,
    "fmod": aten.fmod.Tensor, "remainder": aten.remainder.Tensor, "eq": aten.eq.Tensor, "ne": aten.ne.Tensor,
    "lt": aten.lt.Tensor, "le": aten.le.Tensor, "gt": aten.gt.Tensor, "ge": aten.ge.Tensor,
    "bitwise_and": aten.bitwise_and.Tensor, "bitwise_or": aten.bitwise_or.Tensor,
    "bitwise_xor": aten.bitwise_xor.Tensor,
}
REDUCTIONS = {"sum": aten.sum.dim_IntList, "prod": None, "amax": aten.amax.default, "amin": aten.amin.default}
# ATen ops kept whole, re-exported as kiln_prims.<name>[.<overload>] with the ATen schema.
EXTERN = """mm.default bmm.default convolution.default convolution_backward.default
_scaled_dot_product_flash_attention.default _scaled_dot_product_flash_attention_backward.default
_scaled_dot_product_efficient_attention.default _scaled_dot_product_efficient_attention_backward.default
_scaled_dot_product_flash_attention_for_cpu.default _scaled_dot_product_flash_attention_for_cpu_backward.default
_scaled_dot_product_cudnn_attention.default _scaled_dot_product_cudnn_attention_backward.default
avg_pool2d.default avg_pool2d_backward.default max_pool2d_with_indices.default
max_pool2d_with_indices_backward.default sort.default topk.default cumsum.default gather.default
scatter.src scatter_add.default scatter_reduce.two index.Tensor index_put.default
rand.default randn.default randint.low bernoulli.p _local_scalar_dense.default cat.default
flip.default constant_pad_nd.default""".split()

PRIMS: dict[str, torch._ops.OpOverload] = {}


def _define(name: str, schema: str, impl: Callable[..., Any], fake: Callable[..., Any] | None = None) -> None:
    LIB.define(f"{name}{schema}")
    LIB.impl(name.split(".")[0] if "." not in name else name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kiln_prims::{name}", fake or impl, lib=LIB)
    packet_name, _, overload = name.partition(".")
    PRIMS[name] = getattr(getattr(torch.ops.kiln_prims, packet_name), overload or "default")


def _unary(op: torch._ops.OpOverload) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: op(a)


def _binary(op: torch._ops.OpOverload) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda a, b: op(a, b)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """True division for floating operands, C-style truncation for integers."""
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return aten.div.Tensor(a, b)
    return aten.div.Tensor_mode(a, b, rounding_mode="trunc")


def _reduction(op: torch._ops.OpOverload | None) -> Callable[..., torch.Tensor]:
    def run(a: torch.Tensor, dims: list[int]) -> torch.Tensor:
        if op is None:  # prod has no multi-dim overload
            out = a
            for d in sorted(dims, reverse=True):
                out = aten.prod.dim_int(out, d)
            return aten.clone.default(out) if out is a else out
        if not dims:
            return aten.clone.default(a)
        return op(a, dims) if op is not aten.sum.dim_IntList else op(a, dims, False)
    return run


def _broadcast_in_dim(a: torch.Tensor, shape: list[int], broadcast_dimensions: list[int]) -> torch.Tensor:
    view_shape = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        view_shape[dst] = a.shape[src]
    return aten.expand.default(aten.view.default(a, view_shape) if a.is_contiguous() else
                               aten.view.default(aten.clone.default(a), view_shape), list(shape))


def _reshape(a: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return aten.view.default(a if a.is_contiguous() else aten.clone.default(a, memory_format=torch.contiguous_format), shape)


def _define_all() -> None:
    for name in UNARY:
        _define(name, "(Tensor a) -> Tensor", _unary(getattr(aten, name).default))
    for name, op in BINARY.items():
        _define(name, "(Tensor a, Tensor b) -> Tensor", _binary(op))
    _define("div", "(Tensor a, Tensor b) -> Tensor", _div)
    _define("where", "(Tensor pred, Tensor a, Tensor b) -> Tensor", lambda p, a, b: aten.where.self(p, a, b))
    for name, reduce_op in REDUCTIONS.items():
        _define(name, "(Tensor a, int[] dims) -> Tensor", _reduction(reduce_op))
    _define("argmax", "(Tensor a, int dim) -> Tensor", lambda a, dim: aten.argmax.default(a, dim))
    _define("argmin", "(Tensor a, int dim) -> Tensor", lambda a, dim: aten.argmin.default(a, dim))
    _define("convert_element_type", "(Tensor a, ScalarType dtype) -> Tensor",
            lambda a, dtype: aten._to_copy.default(a, dtype=dtype))
    _define("clone", "(Tensor a) -> Tensor", lambda a: aten.clone.default(a, memory_format=torch.contiguous_format))
    _define("full", "(SymInt[] shape, Scalar value, *, ScalarType dtype, Device device) -> Tensor",
            lambda shape, value, *, dtype, device: aten.full.default(shape, value, dtype=dtype, device=device))
    _define("iota", "(SymInt length, *, Scalar start, Scalar step, ScalarType dtype, Device device) -> Tensor",
            lambda length, *, start, step, dtype, device: aten.add.Tensor(
                aten.mul.Tensor(aten.arange.start_step(0, length, 1, dtype=dtype, device=device), step), start))
    _define("broadcast_in_dim", "(Tensor(a) a, SymInt[] shape, int[] broadcast_dimensions) -> Tensor(a)",
            _broadcast_in_dim)
    _define("reshape", "(Tensor(a) a, SymInt[] shape) -> Tensor(a)", _reshape)
    _define("permute", "(Tensor(a) a, int[] dims) -> Tensor(a)", lambda a, dims: aten.permute.default(a, dims))
    _define("squeeze", "(Tensor(a) a, int[] dims) -> Tensor(a)", lambda a, dims: aten.squeeze.dims(a, dims))
    _define("slice", "(Tensor(a) a, int dim, SymInt start, SymInt end, SymInt step) -> Tensor(a)",
            lambda a, dim, start, end, step: aten.slice.Tensor(a, dim, start, end, step))
    _define("as_strided", "(Tensor(a) a, SymInt[] size, SymInt[] stride, SymInt storage_offset) -> Tensor(a)",
            lambda a, size, stride, off: aten.as_strided.default(a, size, stride, off))
    for full_name in EXTERN:
        _define_extern(full_name)


def _define_extern(full_name: str) -> None:
    name, overload = full_name.split(".")
    op = getattr(getattr(aten, name, None), overload, None)
    if op is None:  # an op this torch version does not have (e.g. a newer attention kernel)
        return
    schema = str(op._schema).split("(", 1)[1]
    prim_name = name if overload == "default" else f"{name}.{overload}"
    _define(prim_name, "(" + schema, lambda *args, **kwargs: op(*args, **kwargs))
    EXTERN_OPS[op] = PRIMS[prim_name]


EXTERN_OPS: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}
_define_all()
