"""Extern kernels (matmul, convolution, attention) and ATen fallbacks: calls the wrapper makes.

Both become an ``ExternKernel`` node whose tensor arguments are strided views of buffers (a transpose
feeding mm costs no copy). Fallbacks are ops without a lowering; each one is reported in perf_hints.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kiln.graph import ATTENTION_BACKWARD_TARGET, ATTENTION_TARGET, is_symbolic, target_name

from ..ir import (
    Arg,
    Constant,
    ConstArg,
    ExternKernel,
    ExternOutput,
    FloorDiv,
    IndexValue,
    Layout,
    ListArg,
    Load,
    Pointwise,
    TensorRef,
    as_index,
    cast,
    index_vars,
    op,
    substitute_index,
    sym_expr,
    walk,
)
from .common import Rule, size_value
from .context import LoweringContext, NotLowered
from .values import Lazy, Strided, TensorValue, is_tensor, value_at

RULES: dict[str, Rule] = {}


def _traced_stride(a: Any, like: Any) -> tuple | None:
    """The stride the trace gave this argument: an extern fed the layout eager fed it (a
    channels-last convolution input) returns the layout eager returned, with no copy after it."""
    val = like.meta.get("val") if isinstance(like, fx.Node) else None
    if not isinstance(val, torch.Tensor) or len(val.shape) != len(a.shape):
        return None
    return tuple(as_index(s) for s in val.stride())


def stored(ctx: LoweringContext, a: TensorValue, like: Any = None) -> Strided:
    """``a`` in memory as an extern takes it: in the traced layout where that is dense, broadcast dims
    the trace passed with stride 0 stored once."""
    stride = _traced_stride(a, like)
    if isinstance(a, Lazy) and stride is not None:
        small = _realize_broadcast(ctx, a, stride)
        if small is not None:
            return small
    return ctx.realize(a, stride)


def to_arg(ctx: LoweringContext, a: Any, like: Any = None) -> Arg:
    if is_tensor(a):
        return stored(ctx, a, like).ref()
    if isinstance(a, (list, tuple)):
        likes = like if isinstance(like, (list, tuple)) and len(like) == len(a) else [None] * len(a)
        return ListArg(tuple(to_arg(ctx, x, y) for x, y in zip(a, likes)))
    if isinstance(a, torch.SymInt) and not free_unbacked_symbols(a):
        return ConstArg(sym_expr(a))  # a size (flash attention backward's max_q): the wrapper computes it
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise NotLowered("symbolic scalar argument")
    if isinstance(a, fx.Node):
        raise NotLowered(f"argument {a.name} has no lowered value")
    return ConstArg(a)


def _realize_broadcast(ctx: LoweringContext, a: Lazy, stride: tuple) -> Strided | None:
    """A lazy value that is constant along some dims which the trace passed with stride 0 (an
    expanded attention mask): store it once with those dims of size 1 and hand the extern a stride-0
    view, as eager did, instead of materialising every copy (BERT's (B, H, L, S) mask per layer)."""
    # only dims the trace passed with stride 0 can be dropped: without one, the body is not walked
    # (most extern operands; walking their fused bodies for free symbols cost 0.35 s on GPT-2 training)
    candidates = [k for k, n in enumerate(a.shape) if n != 1 and stride[k] == 0]
    if not candidates:
        return None
    used: set[sympy.Symbol] = set()
    for e in walk(a.body):
        if isinstance(e, (Load, IndexValue)):
            used |= sympy.sympify(e.index).free_symbols
    ivars = index_vars("i", len(a.shape))
    flat = [k for k in candidates if ivars[k] not in used]
    if not flat:
        return None
    body = substitute_index(a.body, {ivars[k]: sympy.Integer(0) for k in flat})
    small_shape = tuple(sympy.Integer(1) if k in flat else n for k, n in enumerate(a.shape))
    base = ctx.realize(Lazy(small_shape, a.dtype, body))
    return Strided(base.buffer, a.shape, tuple(sympy.Integer(0) if k in flat else st
                                               for k, st in enumerate(base.stride)), base.offset, a.dtype)


def _outputs(ctx: LoweringContext, val: Any, path: tuple[int, ...] = ()) -> list[ExternOutput]:
    if isinstance(val, torch.Tensor):
        if val.device.type not in ("cpu", "cuda"):
            raise NotLowered(f"output on {val.device}")
        layout = Layout(tuple(as_index(s) for s in val.shape), tuple(as_index(s) for s in val.stride()),
                        val.dtype, val.device.type, as_index(0))
        return [ExternOutput(ctx.new_name(), layout, path)]
    if isinstance(val, (list, tuple)):
        out: list[ExternOutput] = []
        for k, v in enumerate(val):
            out += _outputs(ctx, v, path + (k,))
        return out
    if val is None or (isinstance(val, (int, float, bool)) and not isinstance(val, torch.SymInt)):
        # plain numbers (cuDNN attention's max_q/max_k) are known at trace time: consumers get the
        # constant (``_rebuild``), the call's own value at that position is ignored
        return []
    if isinstance(val, torch.SymInt) and not free_unbacked_symbols(val):
        # a size over the graph's size symbols (flash attention's max_q/max_k with a symbolic sequence
        # length): consumers get its expression, which the wrapper computes from the inputs' sizes
        return []
    raise NotLowered(f"non-tensor output {type(val).__name__}")


def extern_call(ctx: LoweringContext, node: fx.Node, kind: str, args: tuple, kwargs: dict,
                holds: tuple[str, ...] = ()) -> Any:
    """Emit an ExternKernel for ``node`` and return its value(s) shaped like the op's result
    (``holds``: see ``ExternKernel.holds``)."""
    val = node.meta.get("val")
    if val is None:
        raise NotLowered(f"node {node.name} has no meta['val']")
    outs = _outputs(ctx, val)
    name = ctx.new_name("extern" if kind == "extern" else "fallback")  # before the arguments' buffers
    arg_refs = tuple(to_arg(ctx, a, like) for a, like in zip(args, _node_args(node, len(args))))
    if target_name(node.target) in _CUDA_ATTENTION:
        arg_refs = tuple(_aligned_unit_strides(a) for a in arg_refs)
    ext = ExternKernel(name, target_name(node.target),
                       arg_refs,
                       tuple((k, to_arg(ctx, v, node.kwargs.get(k))) for k, v in kwargs.items()), tuple(outs), kind,
                       holds)
    ctx.add(ext)
    by_path: dict[tuple[int, ...], TensorValue] = {o.path: Strided(o.buffer, o.layout.shape, o.layout.stride, o.layout.offset, o.layout.dtype)
               for o in outs}
    return _rebuild(val, (), by_path)


# CUDA attention kernels check the alignment of every stride of q/k/v/out, also of a dim of size 1,
# whose stride addresses nothing ("query is not correctly aligned (strideM)": a decode step's
# (B, H, 1, D) query that the symbolic trace gave stride 1 on its length dim). kiln_graph's attention
# ops (symbolic sizes with a mask: eager's composite picks the kernel per call) reach the same kernels
_CUDA_ATTENTION = frozenset(f"aten.{n}" for n in (
    "_scaled_dot_product_efficient_attention.default", "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_cudnn_attention.default", "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_flash_attention_backward.default", "_scaled_dot_product_cudnn_attention_backward.default"
)) | {"kiln_graph.attention.default", "kiln_graph.attention_backward.default"}


def _aligned_unit_strides(a: Any) -> Any:
    """A 4-D tensor argument whose dims of size 1 carry an aligned stride: the same elements, since a
    dim of size 1 is never stepped along, and the kernels' outputs do not depend on it. A dim of size 1
    keeps a stride that is a multiple of 16 for every size (an aligned bias's ``16 * ((s + 15) // 16)``
    rows: replacing it by the contiguous ``s`` made eager's composite pad the mask again in 7 of 8
    decode steps), else takes the stride a contiguous tensor would give it (the next dim's extent),
    else, when that is not a multiple of 16, the stride of the nearest outer dim stepped along if that
    one is. Other arguments unchanged."""
    if not isinstance(a, TensorRef) or len(a.shape) != 4:
        return a
    shape, stride = a.shape, list(a.stride)
    for d in range(len(stride) - 2, -1, -1):
        if shape[d] != 1 or _multiple_of_16(sympy.sympify(stride[d])):
            continue
        contiguous = shape[d + 1] * stride[d + 1] if shape[d + 1] != 1 else stride[d + 1]
        outer = [stride[e] for e in range(d - 1, -1, -1) if shape[e] != 1][:1]
        stride[d] = outer[0] if not _multiple_of_16(sympy.sympify(contiguous)) and outer \
            and _multiple_of_16(sympy.sympify(outer[0])) else contiguous
    stride[-1] = stride[-1] if shape[-1] != 1 else sympy.Integer(1)
    return a if tuple(stride) == tuple(a.stride) else TensorRef(a.buffer, a.shape, tuple(stride), a.offset, a.dtype)


def _node_args(node: fx.Node, n: int) -> list[Any]:
    args = list(node.args)
    return args + [None] * (n - len(args)) if len(args) <= n else [None] * n


def _rebuild(val: Any, path: tuple[int, ...], by_path: dict[tuple[int, ...], TensorValue]) -> Any:
    if isinstance(val, torch.Tensor):
        return by_path[path]
    if is_symbolic(val):
        return sym_expr(val)
    if isinstance(val, (list, tuple)):
        return tuple(_rebuild(v, path + (k,), by_path) for k, v in enumerate(val))
    return val


def _extern(ctx: LoweringContext, node: fx.Node, *args: Any, **kwargs: Any) -> Any:
    return extern_call(ctx, node, "extern", args, kwargs)


for _name in ("mm.default", "bmm.default", "addmm.default", "baddbmm.default", "convolution.default",
              "_convolution.default", "_scaled_dot_product_flash_attention_for_cpu.default",
              "scaled_dot_product_attention.default", "_scaled_dot_product_efficient_attention.default",
              "_scaled_dot_product_flash_attention.default", "_scaled_dot_product_cudnn_attention.default",
              "_scaled_dot_product_flash_attention_backward.default",
              "_scaled_dot_product_efficient_attention_backward.default",
              "_scaled_dot_product_cudnn_attention_backward.default",
              "_scaled_dot_product_flash_attention_for_cpu_backward.default", "addmv.default", "mv.default", "dot.default",
              "_weight_int8pack_mm.default", "linear.default", "matmul.default", "convolution_backward.default",
              "sort.default", "topk.default", "_fft_r2c.default", "_fft_c2r.default", "_fft_c2c.default",
              "_linalg_svd.default", "linalg_vector_norm.default"):
    RULES[f"aten.{_name}"] = _extern
RULES["kiln_inductor.mm_padded.default"] = _extern  # graph_passes/pad_matmuls.py: a misaligned matmul's output

# the attention kernels that take an additive bias, and its position among their arguments
_BIAS_ARG = {"aten._scaled_dot_product_efficient_attention.default": 3,
             "aten._scaled_dot_product_efficient_attention_backward.default": 4,
             "aten._scaled_dot_product_cudnn_attention.default": 3,
             "aten._scaled_dot_product_cudnn_attention_backward.default": 8,
             # kiln.graph attention_op.py: attention whose kernel eager picks per call. On CUDA its mask
             # is stored aligned too: eager pads an unaligned one inside every call (Llama-350M
             # generate() on an H200: a fill and a copy kernel per layer per token, ~1.3 ms of host time
             # per token), where the aligned copy here is made once per graph (the layers share it)
             ATTENTION_TARGET: 3, ATTENTION_BACKWARD_TARGET: 4}
_CUDA_ONLY = frozenset((ATTENTION_TARGET, ATTENTION_BACKWARD_TARGET))


def _attention(ctx: LoweringContext, node: fx.Node, *args: Any, **kwargs: Any) -> Any:
    target = target_name(node.target)
    i = _BIAS_ARG[target]
    like = node.args[i] if i < len(node.args) else None
    val = like.meta.get("val") if isinstance(like, fx.Node) else None
    on_cuda = isinstance(val, torch.Tensor) and val.device.type == "cuda"
    if i < len(args) and is_tensor(args[i]) and (target not in _CUDA_ONLY or on_cuda):
        args = (*args[:i], aligned_bias(ctx, stored(ctx, args[i], node.args[i])), *args[i + 1:])
    return extern_call(ctx, node, "extern", args, kwargs)


def _multiple_of_16(e: sympy.Expr) -> bool:
    """``e`` is a multiple of 16 for every size (a number, or a sum of terms each a multiple of 16)."""
    return all(sympy.Mod(term, 16) == 0 for term in sympy.Add.make_args(sympy.expand(e)))


def aligned_bias(ctx: LoweringContext, v: Strided) -> Strided:
    """An attention bias whose rows start on 16-element boundaries, as torch's ``pad_bias`` leaves it:
    the kernels refuse another layout ("attn_bias is not correctly aligned"). The trace recorded the
    padded view, but storing the value densely dropped the padding (BEiT's 197-wide relative-position
    bias: row stride 197; a symbolic key length s: row stride s). A bias already aligned is passed as
    it is; broadcast (stride-0) dims stay broadcast, stored once. Symbolic sizes pad to a size
    expression, ``16 * ((s + 15) // 16)``."""
    shape = v.shape
    if len(shape) < 2:
        return v
    if v.stride[-1] == 1 and all(_multiple_of_16(sympy.sympify(x)) for x in (*v.stride[:-1], v.offset)):
        return v
    flat = {k for k, (n, st) in enumerate(zip(shape, v.stride)) if st == 0 and n != 1}
    small = [sympy.Integer(1) if k in flat else sympy.sympify(n) for k, n in enumerate(shape)]
    strides = [FloorDiv(small[-1] + 15, 16) * 16, sympy.Integer(1)]
    for n in reversed(small[1:-1]):
        strides.insert(0, strides[0] * n)
    ivars = index_vars("i", len(shape))
    body = value_at(v, [sympy.Integer(0) if k in flat else ivars[k] for k in range(len(shape))])
    row = strides[-2]
    if sympy.expand(row - small[-1]) != 0:  # the padding holds zeros, as torch's pad_bias writes it (left
        # unwritten it held whatever a recycled block held, NaNs included, for a kernel reading past the keys)
        inside = op("lt", IndexValue(ivars[-1], torch.int64), size_value(small[-1], torch.int64), dtype=torch.bool)
        body = op("where", inside, body, cast(Constant(0.0, torch.float64), v.dtype), dtype=v.dtype)
    layout = Layout((*small[:-1], row), tuple(strides), v.dtype)
    base = ctx.computed(layout, Pointwise(layout.shape, body))
    return Strided(base.buffer, shape, tuple(sympy.Integer(0) if k in flat else st for k, st in enumerate(strides)),
                   base.offset, v.dtype)


for _name in _BIAS_ARG:
    RULES[_name] = _attention
# linalg_vector_norm and sort/topk are library calls here; listed as externs so they are not reported
# as missing lowerings.
del RULES["aten.linalg_vector_norm.default"]
