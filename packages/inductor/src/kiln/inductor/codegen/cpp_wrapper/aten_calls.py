"""ATen calls from generated C++: an extern or fallback node as a boxed call through the dispatcher.

Why boxed: one emitter covers every op the Python wrapper may call (matmuls, convolutions, attention
and any ATen fallback) from its schema alone, with each argument pushed as the ``c10::IValue`` its
declared type wants (``kiln_rt::Stack``, kiln/model_support.h) and the schema's defaults filled in.
The boxed path costs a little more per call than a typed one; matmuls and convolutions get typed
calls (``TYPED``) because models make dozens of them per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import sympy
import torch

from kiln.graph import ATTENTION, ATTENTION_TARGET

from ...ir import Arg, ConstArg, ExternKernel, ListArg, TensorRef
from ..cpp.exprs import cindex


class CppWrapperUnsupported(Exception):
    """Something the C++ wrapper cannot call without Python (a custom op, a Python-only value)."""


# c10::ScalarType's values (kiln/model_support.h's Dtype codes)
SCALAR_TYPES: dict[torch.dtype, int] = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11,
    torch.bfloat16: 15,
}
_LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1}
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                   torch.channels_last_3d: 3}


def scalar_type(d: torch.dtype) -> str:
    """The dtype's code as a C++ expression (with its name, for the reader)."""
    try:
        return f"{SCALAR_TYPES[d]} /*{str(d).removeprefix('torch.')}*/"
    except KeyError:
        raise CppWrapperUnsupported(f"dtype {d} has no C++ spelling in the C++ wrapper") from None


def cdouble(v: float) -> str:
    """A double as a C++ literal (inf and nan spelled through numeric_limits)."""
    if math.isnan(v):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}std::numeric_limits<double>::infinity()"
    return repr(float(v))


def cstr(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar(v: Any) -> str:
    """A Python constant as one push onto a ``kiln_rt::Stack``."""
    if isinstance(v, bool):
        return f".b({'true' if v else 'false'})"
    if isinstance(v, sympy.Expr):  # a symbolic size
        return f".i({_int(v)})"
    if isinstance(v, int):
        return f".i({v}LL)"
    if isinstance(v, float):
        return f".d({cdouble(v)})"
    if isinstance(v, str):
        return f".str({cstr(v)})"
    if isinstance(v, torch.dtype):
        return f".scalar_type({scalar_type(v)})"
    if isinstance(v, torch.memory_format):
        return f".memory_format({_MEMORY_FORMATS[v]})"
    if isinstance(v, torch.layout) and v in _LAYOUTS:
        return f".layout({_LAYOUTS[v]})"
    if isinstance(v, torch.device):
        return f".device({cstr(str(v))})"
    raise CppWrapperUnsupported(f"constant {v!r} of type {type(v).__name__} has no C++ form")


def _strip_optional(t: str) -> str:
    return t[len("Optional["):-1] if t.startswith("Optional[") else t


def push(a: Arg | Any, typ: str, tensor: Callable[[TensorRef], str]) -> str:
    """``a`` pushed onto a ``kiln_rt::Stack`` for a schema argument of type ``typ`` (``.i(3)``, ...)."""
    if isinstance(a, ConstArg):
        a = a.value
    if a is None:
        # a Tensor (not optional) the traced graph holds as None: torch's meta of cuDNN attention returns None for
        # its cumulative sequence lengths, which its backward takes as ``Tensor``. Python's binding passes an
        # undefined tensor for None there; an IValue None failed the op's unboxing ("Expected Tensor but got
        # None": the C++ wrapper of every CUDA training graph with cuDNN attention, found on an H100)
        return ".tensor(kiln_rt::Tensor())" if typ == "Tensor" else ".none()"
    typ = _strip_optional(typ)
    if isinstance(a, TensorRef):
        return f".tensor({tensor(a)})"
    items = a.items if isinstance(a, ListArg) else a if isinstance(a, (list, tuple)) else None
    if items is not None:
        inner = _strip_optional(typ[len("List["):-1]) if typ.startswith("List[") else ""
        if inner == "Tensor":
            parts = ["kiln_rt::Tensor()" if _none(x) else tensor(x) if isinstance(x, TensorRef) else _bad(x)
                     for x in items]
            kind = "optional_tensors" if typ.startswith("List[Optional[") else "tensors"
            return f".{kind}({{{', '.join(parts)}}})"
        if inner in ("int", "SymInt"):
            return f".ints({{{', '.join(_int(_v(x)) for x in items)}}})"
        if inner == "float":
            return f".doubles({{{', '.join(cdouble(float(_v(x))) for x in items)}}})"
        if inner == "bool":
            return f".bools({{{', '.join('true' if _v(x) else 'false' for x in items)}}})"
        raise CppWrapperUnsupported(f"list argument of schema type {typ} has no C++ form")
    if typ == "float" and isinstance(a, int) and not isinstance(a, bool):
        a = float(a)
    if typ in ("int", "SymInt") and isinstance(a, float) and a.is_integer():
        a = int(a)
    return _scalar(a)


def _int(v: Any) -> str:
    """An int argument as C++: the integer, or a symbolic size's expression over the size symbols."""
    if isinstance(v, sympy.Expr) and not isinstance(v, sympy.Integer):
        return f"int64_t{{{cindex(v)}}}"
    return f"{int(v)}LL"


def _none(x: Any) -> bool:
    return x is None or (isinstance(x, ConstArg) and x.value is None)


def _v(x: Any) -> Any:
    return x.value if isinstance(x, ConstArg) else x


def _bad(x: Any) -> str:
    raise CppWrapperUnsupported(f"tensor list item {x!r} is not a tensor")


# kiln_graph::attention (kiln.graph attention_op.py: symbolic masked attention whose kernel eager picks per
# call) is a torch.library op whose kernel is F.scaled_dot_product_attention: from C++ it is that ATen
# composite, which picks the same kernel per call (its arguments: ``sdpa_form``)
_SDPA = "aten.scaled_dot_product_attention.default"


def sdpa_form(e: ExternKernel) -> ExternKernel:
    """``e`` with a kiln_graph::attention call as the ATen composite it runs; any other call as it is."""
    if e.target != ATTENTION_TARGET:
        return e
    names = [a.name for a in ATTENTION._schema.arguments]
    given = {**dict(zip(names, e.args)), **dict(e.kwargs)}
    q, k, v, mask = (given[n] for n in ("q", "k", "v", "mask"))
    return replace(e, target=_SDPA, args=(q, k, v, mask, ConstArg(0.0), given["is_causal"]),
                   kwargs=(("scale", given["scale"]), ("enable_gqa", given["enable_gqa"])))


def op_overload(target: str) -> torch._ops.OpOverload:
    if target == ATTENTION_TARGET:
        target = _SDPA
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
    """Every schema argument of ``e``'s op in order, as pushes onto a ``kiln_rt::Stack`` (defaults filled in)."""
    e = sdpa_form(e)
    schema = op_overload(e.target)._schema
    kwargs = dict(e.kwargs)
    out: list[str] = []
    for k, arg in enumerate(schema.arguments):
        typ = str(arg.type)
        if k < len(e.args) and not arg.kwarg_only:
            out.append(push(e.args[k], typ, tensor))
        elif arg.name in kwargs:
            out.append(push(kwargs.pop(arg.name), typ, tensor))
        elif arg.has_default_value():
            out.append(push(arg.default_value, typ, tensor))
        else:
            raise CppWrapperUnsupported(f"{e.target}: no value for argument {arg.name!r}")
    if kwargs:
        raise CppWrapperUnsupported(f"{e.target}: unknown keyword arguments {sorted(kwargs)}")
    return out


def n_returns(target: str) -> int:
    return len(op_overload(target)._schema.returns)


# ops with a typed ATen function of the same arguments (all tensors or int lists): no boxing per call
TYPED: dict[str, str] = {
    "aten.mm.default": "kiln_rt::mm", "aten.addmm.default": "kiln_rt::addmm", "aten.bmm.default": "kiln_rt::bmm",
    "aten.baddbmm.default": "kiln_rt::baddbmm", "aten.convolution.default": "kiln_rt::convolution",
}
_CONV_LISTS = (3, 4, 5, 7)  # stride, padding, dilation, output_padding


def typed_call(e: ExternKernel, tensor: Callable[[TensorRef], str]) -> str | None:
    """``at::mm(a, b)`` for an all-tensor matmul, ``at::convolution(...)`` for a convolution with constant
    options (None otherwise: the boxed call)."""
    if e.target not in TYPED or e.kwargs:
        return None
    fn = TYPED[e.target]
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
    bias = tensor(a[2]) if isinstance(a[2], TensorRef) else "kiln_rt::Tensor()" if _none(a[2]) else None
    if bias is None:
        return None
    lists = {k: "{" + ", ".join(f"{int(_v(x))}" for x in a[k].items) + "}"  # type: ignore[union-attr]
             for k in _CONV_LISTS}
    return (f"{fn}({tensor(a[0])}, {tensor(a[1])}, {bias}, {lists[3]}, {lists[4]}, {lists[5]}, "
            f"{'true' if _v(a[6]) else 'false'}, {lists[7]}, {int(_v(a[8]))})")
