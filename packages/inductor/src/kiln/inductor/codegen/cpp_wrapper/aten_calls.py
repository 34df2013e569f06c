"""ATen calls from generated C++: an extern or fallback node as a boxed call through the dispatcher.

Why boxed: one emitter covers every op the Python wrapper may call (matmuls, convolutions, attention
and any ATen fallback) from its schema alone, with each argument built as the ``c10::IValue`` its
declared type wants and the schema's defaults filled in. The dispatcher's boxed path costs a few
hundred nanoseconds more per call than a typed ``at::mm``; the common matmuls get typed calls
(``TYPED``) because a transformer makes dozens of them per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...ir import Arg, ConstArg, ExternKernel, ListArg, TensorRef


class CppWrapperUnsupported(Exception):
    """Something the C++ wrapper cannot call without Python (a custom op, a Python-only value)."""


SCALAR_TYPES: dict[torch.dtype, str] = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def scalar_type(d: torch.dtype) -> str:
    try:
        return f"at::ScalarType::{SCALAR_TYPES[d]}"
    except KeyError:
        raise CppWrapperUnsupported(f"dtype {d} has no C++ spelling in the C++ wrapper") from None


def _double(v: float) -> str:
    if math.isnan(v):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}std::numeric_limits<double>::infinity()"
    return repr(float(v))


_MEMORY_FORMATS = {torch.contiguous_format: "Contiguous", torch.channels_last: "ChannelsLast",
                   torch.preserve_format: "Preserve", torch.channels_last_3d: "ChannelsLast3d"}


def _scalar(v: Any) -> str:
    """A Python constant as a C++ expression convertible to ``c10::IValue``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"int64_t({v}LL)"
    if isinstance(v, float):
        return f"double({_double(v)})"
    if isinstance(v, str):
        return f"std::string({v!r})".replace("'", '"')
    if isinstance(v, torch.dtype):
        return scalar_type(v)
    if isinstance(v, torch.memory_format):
        return f"c10::MemoryFormat::{_MEMORY_FORMATS[v]}"
    if isinstance(v, torch.layout):
        return "c10::Layout::Strided" if v == torch.strided else f"c10::Layout::{str(v).split('.')[-1].capitalize()}"
    if isinstance(v, torch.device):
        return f"c10::Device(std::string({str(v)!r}))".replace("'", '"')
    raise CppWrapperUnsupported(f"constant {v!r} of type {type(v).__name__} has no C++ form")


def _strip_optional(t: str) -> str:
    return t[len("Optional["):-1] if t.startswith("Optional[") else t


def ivalue(a: Arg | Any, typ: str, tensor: Callable[[TensorRef], str]) -> str:
    """``a`` as a C++ expression of a ``c10::IValue`` for a schema argument of type ``typ``."""
    if isinstance(a, ConstArg):
        a = a.value
    if a is None:
        return "c10::IValue()"
    typ = _strip_optional(typ)
    if isinstance(a, TensorRef):
        return f"c10::IValue({tensor(a)})"
    items = a.items if isinstance(a, ListArg) else a if isinstance(a, (list, tuple)) else None
    if items is not None:
        inner = _strip_optional(typ[len("List["):-1]) if typ.startswith("List[") else ""
        if inner == "Tensor":
            opt = typ.startswith("List[Optional[")
            elem = "std::optional<at::Tensor>" if opt else "at::Tensor"
            parts = [("std::optional<at::Tensor>()" if opt else "at::Tensor()") if _none(x) else
                     (f"{elem}({tensor(x)})" if isinstance(x, TensorRef) else _bad(x)) for x in items]
            return f"c10::IValue(c10::List<{elem}>({{{', '.join(parts)}}}))"
        if inner in ("int", "SymInt"):
            return f"c10::IValue(c10::List<int64_t>({{{', '.join(f'int64_t({int(_v(x))}LL)' for x in items)}}}))"
        if inner == "float":
            return f"c10::IValue(c10::List<double>({{{', '.join(_double(float(_v(x))) for x in items)}}}))"
        if inner == "bool":
            return f"c10::IValue(c10::List<bool>({{{', '.join(_scalar(bool(_v(x))) for x in items)}}}))"
        raise CppWrapperUnsupported(f"list argument of schema type {typ} has no C++ form")
    if typ == "float" and isinstance(a, int) and not isinstance(a, bool):
        a = float(a)
    if typ in ("int", "SymInt") and isinstance(a, float) and a.is_integer():
        a = int(a)
    return f"c10::IValue({_scalar(a)})"


def _none(x: Any) -> bool:
    return x is None or (isinstance(x, ConstArg) and x.value is None)


def _v(x: Any) -> Any:
    return x.value if isinstance(x, ConstArg) else x


def _bad(x: Any) -> str:
    raise CppWrapperUnsupported(f"tensor list item {x!r} is not a tensor")


def op_overload(target: str) -> torch._ops.OpOverload:
    ns, op, overload = target.split(".", 2)
    if ns not in ("aten", "prims"):
        raise CppWrapperUnsupported(
            f"{target} is not an ATen op: a package calls ops through libtorch's dispatcher without Python, "
            "so an op a Python library registers (torch.library) cannot be called there")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)  # type: ignore[no-any-return]


def schema_name(target: str) -> tuple[str, str]:
    """(``"aten::addmm"``, overload name as the dispatcher spells it, "" for default)."""
    schema = op_overload(target)._schema
    return schema.name, schema.overload_name


def boxed_arguments(e: ExternKernel, tensor: Callable[[TensorRef], str]) -> list[str]:
    """Every schema argument of ``e``'s op in order, as ``c10::IValue`` expressions (defaults filled in)."""
    schema = op_overload(e.target)._schema
    kwargs = dict(e.kwargs)
    out: list[str] = []
    for k, arg in enumerate(schema.arguments):
        typ = str(arg.type)
        if k < len(e.args) and not arg.kwarg_only:
            out.append(ivalue(e.args[k], typ, tensor))
        elif arg.name in kwargs:
            out.append(ivalue(kwargs.pop(arg.name), typ, tensor))
        elif arg.has_default_value():
            out.append(ivalue(arg.default_value, typ, tensor))
        else:
            raise CppWrapperUnsupported(f"{e.target}: no value for argument {arg.name!r}")
    if kwargs:
        raise CppWrapperUnsupported(f"{e.target}: unknown keyword arguments {sorted(kwargs)}")
    return out


def n_returns(target: str) -> int:
    return len(op_overload(target)._schema.returns)


# ops with a typed ATen function of the same arguments (all tensors or int lists): no boxing per call
TYPED: dict[str, tuple[str, str]] = {
    "aten.mm.default": ("at::mm", "ATen/ops/mm.h"),
    "aten.addmm.default": ("at::addmm", "ATen/ops/addmm.h"),
    "aten.bmm.default": ("at::bmm", "ATen/ops/bmm.h"),
    "aten.baddbmm.default": ("at::baddbmm", "ATen/ops/baddbmm.h"),
    "aten.convolution.default": ("at::convolution", "ATen/ops/convolution.h"),
}
_CONV_LISTS = (3, 4, 5, 7)  # stride, padding, dilation, output_padding


def typed_call(e: ExternKernel, tensor: Callable[[TensorRef], str]) -> str | None:
    """``at::mm(a, b)`` for an all-tensor matmul, ``at::convolution(...)`` for a convolution with constant
    options (None otherwise: the boxed call)."""
    if e.target not in TYPED or e.kwargs:
        return None
    fn, _ = TYPED[e.target]
    if e.target == "aten.convolution.default":
        return _typed_convolution(e, fn, tensor)
    if not all(isinstance(a, TensorRef) for a in e.args):
        return None
    return f"{fn}({', '.join(tensor(a) for a in e.args)})"  # type: ignore[arg-type]


def _typed_convolution(e: ExternKernel, fn: str, tensor: Callable[[TensorRef], str]) -> str | None:
    a = e.args
    if len(a) != 9 or not isinstance(a[0], TensorRef) or not isinstance(a[1], TensorRef):
        return None
    if not all(isinstance(a[k], ListArg) and all(isinstance(x, ConstArg) for x in a[k].items)  # type: ignore[union-attr]
               for k in _CONV_LISTS):
        return None
    if not (isinstance(a[6], ConstArg) and isinstance(a[8], ConstArg)):
        return None
    bias = tensor(a[2]) if isinstance(a[2], TensorRef) else "std::optional<at::Tensor>()" if _none(a[2]) else None
    if bias is None:
        return None
    lists = {k: "at::IntArrayRef({" + ", ".join(f"int64_t({int(_v(x))})" for x in a[k].items) + "})"  # type: ignore[union-attr]
             for k in _CONV_LISTS}
    return (f"{fn}({tensor(a[0])}, {tensor(a[1])}, {bias}, {lists[3]}, {lists[4]}, {lists[5]}, "
            f"{_scalar(bool(_v(a[6])))}, {lists[7]}, int64_t({int(_v(a[8]))}))")
