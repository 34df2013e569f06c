"""lower_graph: walk a functional ATen graph and build a LoopProgram through the lowering registry."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

from kiln.graph import target_name

from ..graph_passes.conv_layout import channels_last_stride
from ..graph_passes.cse import storage_root
from ..ir import (
    ConstArg,
    DynamicShapeUnsupported,
    InputBuffer,
    Layout,
    LoopProgram,
    Op,
    Output,
    SymScalar,
    TensorRef,
    as_index,
    is_dense,
    is_static,
    is_symbolic,
    reads,
    sym_expr,
    sym_scalar,
    walk,
)
from ..options import InductorOptions
from .common import out_stride
from .context import LoweringContext, NotLowered
from .extern import RULES as EXTERN_RULES
from .extern import extern_call
from .registry import LOWERINGS, TAKES_SYMBOLIC_FLOATS
from .symbolic import SizeTable
from .values import Lazy, Strided, TensorValue, is_tensor


class LoweringError(Exception):
    """A graph cannot be lowered at all (not one op: the graph's structure)."""


def _map(a: Any, env: dict[fx.Node, Any]) -> Any:
    if isinstance(a, fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_map(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _map(v, env) for k, v in a.items()}
    return a


def _input(ctx: LoweringContext, node: fx.Node, position: int, example: Any, sizes: SizeTable) -> Any:
    val = node.meta.get("val", example)
    if not isinstance(val, torch.Tensor):
        if isinstance(val, torch.SymInt) and is_symbolic(val):
            return sizes.scalar(val, position)  # a symbolic int input: its size symbol
        if isinstance(val, torch.SymFloat) and is_symbolic(val):
            return sizes.float_scalar(val, position)  # a float argument that varies: a double kernel argument
        return val
    if val.device.type not in ("cpu", "cuda"):
        raise LoweringError(f"input {node.name} is on {val.device}; kiln.inductor compiles CPU (C++) and CUDA "
                            "(Triton) graphs")
    name = f"arg{position}"
    if any(is_symbolic(s) for s in (*val.shape, *val.stride(), val.storage_offset())):
        layout = sizes.tensor(val, name)
    else:
        layout = Layout(tuple(as_index(s) for s in val.shape), tuple(as_index(s) for s in val.stride()),
                        val.dtype, val.device.type)
    ctx.inputs.append(InputBuffer(name, layout, position))
    ctx.layouts[name] = layout
    off = val.storage_offset()
    ctx.storage_offsets[name] = sym_expr(off) if is_symbolic(off) else int(off)
    return Strided(name, layout.shape, layout.stride, layout.offset, layout.dtype)


def lower_node(ctx: LoweringContext, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args, kwargs = _map(node.args, env), _map(node.kwargs, env)
    if node.target is operator.getitem:
        return args[0][args[1]]
    name = target_name(node.target)
    ctx.origin = _origin(name)
    rule = LOWERINGS.get(name)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.device.type not in ("cpu", "cuda"):
        # a factory under ``with torch.device("meta")`` beside CPU inputs: no kernel can write there
        raise LoweringError(f"{name} at node {node.name} makes a tensor on {val.device}; kiln.inductor "
                            "compiles CPU (C++) and CUDA (Triton) graphs")
    if isinstance(val, torch.SymFloat):  # float arithmetic on sizes (ir/scalars.py), or its constant value
        return sym_scalar(val) if is_symbolic(val) else float(val.node.expr)
    if is_symbolic(val):  # size arithmetic (sym_size, mul of sizes, ...): the value is its expression
        return sym_expr(val)
    if name.startswith(("aten._assert", "aten.sym_constrain")):
        return None  # the caller's guards hold these relations
    if rule is None and isinstance(val, (bool, int, float, torch.device, torch.dtype)) \
            and not isinstance(val, torch.SymInt):
        return val  # metadata queries (prim.device, sym_size of a static dim) fold to their value
    reason = "no lowering"
    if rule is not None and _touches_complex(node):
        rule, reason = None, "complex dtypes have no generated kernels"
    other = _other_device(node, ctx.device) if rule is not None else None
    if other is not None:  # a CPU node of a CUDA graph: no generated kernel may read or write its memory
        rule, reason = None, f"it reads or makes a {other} tensor and the graph's kernels run on {ctx.device}"
    if rule is not None and name not in TAKES_SYMBOLIC_FLOATS and _has_sym_scalar((args, kwargs)):
        rule, reason = None, "its rule takes no symbolic float argument (the wrapper computes it)"
    if rule is not None:
        try:
            return rule(ctx, node, *args, **kwargs)
        except NotLowered as e:
            reason = str(e)
        except DynamicShapeUnsupported:
            raise  # the caller compiles the graph again with static sizes
        except Exception as e:  # a bug in a rule: keep the program correct through ATen, and say so
            if ctx.options.strict_lowering:
                raise
            reason = f"lowering rule failed: {type(e).__name__}: {e}"
    if not ctx.options.fallback_unknown_ops:
        raise LoweringError(f"{name} at node {node.name} cannot be lowered ({reason}) and fallbacks are off")
    ctx.perf_hint(f"fallback: {name} runs through ATen ({reason}) at node {node.name}")
    try:
        return extern_call(ctx, node, "fallback", args, kwargs)
    except NotLowered as e:
        raise LoweringError(f"{name} at node {node.name}: cannot lower or fall back: {e}") from e


def _origin(name: str) -> str:
    """The op's short name as a C identifier, for kernel names: "aten.add.Tensor" -> add,
    "kiln_inductor.mm_padded.default" -> mm_padded, "operator.mul" (size arithmetic) -> mul."""
    parts = name.split(".")
    return re.sub(r"\W", "_", parts[1] if len(parts) >= 3 else parts[-1])


def _has_sym_scalar(a: Any) -> bool:
    if isinstance(a, SymScalar):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_sym_scalar(x) for x in a)
    if isinstance(a, dict):
        return any(_has_sym_scalar(x) for x in a.values())
    return False


def _touches_complex(node: fx.Node) -> bool:
    """A node that reads or makes a complex tensor (np.fft code): it runs through ATen."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(t, torch.Tensor) and t.is_complex()
               for v in vals for t in (v if isinstance(v, (list, tuple)) else (v,)))


def _other_device(node: fx.Node, device: str) -> str | None:
    """The device type, other than ``device``, of a tensor ``node`` reads or makes (None when none is)."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for t in (t for v in vals for t in (v if isinstance(v, (list, tuple)) else (v,))):
        if isinstance(t, torch.Tensor) and t.device.type != device:
            return t.device.type
    return None


def lower_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: InductorOptions,
                name: str = "graph", device: str | None = None) -> tuple[LoopProgram, list[str]]:
    """``device``: where the backend's kernels run (default: CUDA when an example input is there, else
    CPU); a node that reads or makes a tensor on another device runs through ATen."""
    if device is None:
        cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
        device = "cuda" if cuda else "cpu"
    ctx = LoweringContext(options, device)
    sizes = SizeTable()
    env: dict[fx.Node, Any] = {}
    outputs: list[Output] = []
    position = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            ex = example_inputs[position] if position < len(example_inputs) else None
            env[node] = _input(ctx, node, position, ex, sizes)
            position += 1
        elif node.op == "call_function":
            val = lower_node(ctx, node, env)
            if is_tensor(val):
                val = ctx.maybe_realize(val, len(node.users), _layout_hint(node))
                val = _share_stored(ctx, node, val)
                val = _store_broadcast_transcendental(ctx, node, val)
                val = _store_amplified_reads(ctx, node, val)
            env[node] = val
        elif node.op == "output":
            ctx.origin = "output"  # values left lazy until now are stored for the graph's outputs
            outputs = _distinct_outputs(ctx, _flat_outputs(node.args[0]), env)
        else:
            raise LoweringError(f"{node.op} node {node.name} ({node.target}) is not supported by kiln.inductor; "
                                "lift constants and submodules into graph inputs")
    program = LoopProgram(name, tuple(ctx.inputs), tuple(ctx.nodes), tuple(outputs), ctx.seed_buffer)
    if sizes.sources:
        program = sizes.finish(program)
    return program, ctx.fallbacks


def _share_stored(ctx: LoweringContext, node: fx.Node, val: Any) -> Any:
    """A small pointwise value left lazy for several consumers is realized here when one of them
    stores it anyway (an extern call's operand, a graph output): the others read that buffer instead
    of recomputing it. Recomputing would keep every buffer the value reads alive until the last
    consumer: ResNet-50's block output, relu(bn(conv3) + bn(downsample)), stored for the next
    convolution and recomputed for the next residual add, held both 49 MB convolution outputs (bf16,
    batch 32) across the whole next block."""
    if not isinstance(val, Lazy) or len(node.users) < 2:
        return val
    if not any(u.op == "output" or (u.op == "call_function" and target_name(u.target) in EXTERN_RULES)
               for u in node.users):
        return val
    traced = node.meta.get("val")
    if not isinstance(traced, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in traced.stride()):
        return val
    stride = tuple(as_index(s) for s in traced.stride())
    if not is_dense(val.shape, stride):
        return val  # an expanded value: the extern stores it once with stride-0 dims (extern.py)
    return ctx.realize(val, stride)


# Ops that cost a libm call per element on the CPU (tens of cycles scalar, several even vectorised).
_TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "erf", "erfc",
                             "sigmoid", "pow", "sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh"})


def _store_broadcast_transcendental(ctx: LoweringContext, node: fx.Node, val: Any) -> Any:
    """On the CPU, a lazy value that computes a transcendental and that a consumer reads broadcast is
    stored once instead of recomputed per element that reads it.

    Why: a Llama's rotary ``cos``/``sin`` (batch, 1, seq, head_dim) is read by the query's and the key's
    rotation over every head: left lazy, each rotated element evaluated its own ``cos`` and ``sin``
    (4 libm calls per query/key element instead of 2 per position), which made the tiny Llama
    serving stream ~12% slower than torch.compile on the CPU (perf: ``__sincosf_fma`` and the rotation
    kernels). On the GPU these ops are cheap and fusing saves memory traffic, so this is for the C++
    kernels only (Triton on CPU tensors stands for the GPU's code). A value read at its own size
    (softmax's ``exp``, read by its sum and its division) stays lazy: the C++ kernel caches it per row."""
    if ctx.device != "cpu" or ctx.options.cpu_backend != "cpp" or not isinstance(val, Lazy):
        return val
    if not any(_reads_broadcast(node, u) for u in node.users):
        return val
    if not any(type(e) is Op and e.name in _TRANSCENDENTAL for e in walk(val.body)):
        return val
    return ctx.realize(val, _layout_hint(node))


# A lazy value a consumer reads this many times per element (or more) is stored once when its body does more
# than read one buffer. Each use of a lazy value evaluates its body again: a one-row matmul rewritten as a
# reduction (gemv_as_reduction.py) reads its vector once per output column, so a vector left lazy (decode's
# RMSNorm before q/k/v, the SwiGLU product before the down projection) was recomputed -- its inputs re-read,
# its sigmoid evaluated -- by every program of the reduction: 1024 programs x 6144 elements x two fp32 loads
# (50 MB from L2) around 12.6 MB of weights. Stored, each program reads the bf16 vector. Broadcasts of a few
# dozen reads (a rotary table over the heads) stay lazy: there, recomputing is cheaper than storing.
AMPLIFIED_READS = 512
_PASS_THROUGH = frozenset({"aten.unsqueeze.default", "aten.view.default", "aten.reshape.default", "aten.expand.default",
                           "aten.squeeze.dim", "aten.squeeze.dims", "aten.permute.default", "aten.transpose.int",
                           "aten.t.default", "aten._to_copy.default", "prims.convert_element_type.default"})


def _store_amplified_reads(ctx: LoweringContext, node: fx.Node, val: Any) -> Any:
    if not isinstance(val, Lazy):
        return val
    base = _static_numel(node)
    if not base or _read_factor(node, node, base) < AMPLIFIED_READS:
        return val
    if len({ld.buffer for ld in reads(val.body)}) < 2 and \
            not any(type(e) is Op and e.name in _TRANSCENDENTAL for e in walk(val.body)):
        return val  # a cast of one load: its stored read would cost the same
    return ctx.realize(val, _layout_hint(node))


def _read_factor(node: fx.Node, via: fx.Node, base: int, depth: int = 0) -> float:
    """How many times the consumers of ``via`` (``node`` itself, or a view or cast of it) read each of
    ``node``'s ``base`` elements, at most: a pointwise consumer over more elements broadcasts it; another
    consumer reads each element of ``via`` once (more than ``base`` when ``via`` expands it)."""
    best = 1.0
    for u in via.users:
        if u.op != "call_function":
            continue
        if target_name(u.target) in _PASS_THROUGH and depth < 4:
            best = max(best, _read_factor(node, u, base, depth + 1))
            continue
        pointwise = torch.Tag.pointwise in getattr(u.target, "tags", ())
        n = _static_numel(u) if pointwise else _static_numel(via)
        best = max(best, (n or 0) / base)
    return best


def _static_numel(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return val.numel()


def _reads_broadcast(node: fx.Node, user: fx.Node) -> bool:
    """Whether ``user`` is elementwise and its result has a dim where ``node``'s (right-aligned) has size
    1 or none: each of ``node``'s elements is read for several of the user's."""
    mine, theirs = node.meta.get("val"), user.meta.get("val")
    if not isinstance(mine, torch.Tensor) or not isinstance(theirs, torch.Tensor):
        return False
    if user.op != "call_function" or torch.Tag.pointwise not in getattr(user.target, "tags", ()):
        return False  # a stack or a gather reads each element once whatever the shapes
    if theirs.dim() > mine.dim():
        return any(not _is_one(s) for s in theirs.shape[:theirs.dim() - mine.dim()])
    if theirs.dim() < mine.dim():
        return False
    return any(_is_one(a) and not _is_one(b) for a, b in zip(mine.shape, theirs.shape))


def _is_one(s: object) -> bool:
    return isinstance(s, int) and s == 1


def _layout_hint(node: fx.Node) -> tuple | None:
    """Realized values keep a traced channels-last layout (graph_passes/conv_layout.py) and a graph
    output its traced symbolic layout (``_output_layout``); others are stored contiguous."""
    st = channels_last_stride(node)
    return tuple(as_index(s) for s in st) if st is not None else _output_layout(node)


def _output_layout(node: fx.Node) -> tuple | None:
    """The traced strides of a graph output with symbolic strides, when they lay it out densely.

    Why: with symbolic sizes the caller reads an output with its traced strides (``_output``). A value
    realized early for another consumer too (Llama's rotary-embedded query: attention's operand and a
    saved activation, traced transposed) must be stored in that layout, or the output could not be
    returned for every size."""
    traced = node.meta.get("val")
    if not isinstance(traced, torch.Tensor) or not any(u.op == "output" for u in node.users):
        return None
    stride = out_stride(node)
    if all(is_static(x) for x in stride):
        return None
    stride = tuple(_size_one_floor_dropped(x) for x in stride)
    shape = tuple(_size_one_floor_dropped(as_index(s)) for s in traced.shape)
    return stride if is_dense(shape, stride) else None


def _flat_outputs(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _distinct_outputs(ctx: LoweringContext, args: Sequence[Any], env: dict[fx.Node, Any]) -> list[Output]:
    """The graph's outputs, different values in different memory: the lowering merges equal loops
    (``LoweringContext.computed``), and two outputs it made one buffer (``clone(a)`` twice) would share
    memory that eager's do not (writing into one would change the other). Outputs that are one value
    or views of one value in the graph keep sharing it."""
    outputs: list[Output] = []
    owner: dict[str, fx.Node] = {}  # buffer -> the graph value (after views) whose memory it is
    for a in args:
        ref = _output(ctx, a, env)
        if isinstance(a, fx.Node) and isinstance(ref, TensorRef):
            root = storage_root(a)
            if owner.setdefault(ref.buffer, root) is not root:
                ref = ctx.copy(Strided(ref.buffer, ref.shape, ref.stride, ref.offset, ref.dtype)).ref()
                owner[ref.buffer] = root
        outputs.append(ref)
    return outputs


def _output(ctx: LoweringContext, a: Any, env: dict[fx.Node, Any]) -> Output:
    if not isinstance(a, fx.Node):
        return ConstArg(a)
    v = env[a]
    if not is_tensor(v):
        return ConstArg(v)
    tv: TensorValue = v
    stride = out_stride(a) if isinstance(a.meta.get("val"), torch.Tensor) else None
    if stride is not None and not all(is_static(x) for x in stride):
        stride = tuple(_size_one_floor_dropped(x) for x in stride)
    ref = ctx.realize(tv, stride).ref()
    if stride is not None and not all(is_static(x) for x in stride) and not _same_or_broadcast(ref, stride):
        # symbolic sizes: compile_graph reports no output strides, so a caller (kiln.autograd's backward)
        # reads this output with the traced ones; a strided view with gaps cannot be given those
        raise DynamicShapeUnsupported(f"output {a.name} was traced with strides {stride} that are neither "
                                      "dense nor broadcast; kiln.inductor cannot return them for every size")
    return ref


def _size_one_floor_dropped(st: Any) -> Any:
    """torch's contiguous strides multiply ``Max(1, size)``: the same as ``size`` for every non-empty
    tensor (an empty one is never read), and what kiln's own strides say."""
    if not isinstance(st, sympy.Basic):
        return st
    return st.replace(lambda e: isinstance(e, sympy.Max) and len(e.args) == 2 and sympy.Integer(1) in e.args,
                      lambda e: next(a for a in e.args if a != 1))


def _same_or_broadcast(ref: Any, stride: tuple) -> bool:
    """The returned strides equal the traced ones wherever they matter (stride-0 dims read one row,
    which every row of the dense copy equals)."""
    return all(n == 1 or b == 0 or sympy.expand(_size_one_floor_dropped(a) - b) == 0
               for n, a, b in zip(ref.shape, ref.stride, stride))
