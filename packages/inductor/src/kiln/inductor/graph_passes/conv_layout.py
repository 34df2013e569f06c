"""Channels-last layout for convolution graphs (``InductorOptions.conv_layout``).

cuDNN (and oneDNN) run 2-D convolutions in NHWC; fed NCHW tensors they wrap every convolution in
``nchwToNhwc`` / ``nhwcToNchw`` transposes. This pass rewrites the FX graph so that every 2-D
convolution reads channels-last operands (a ``clone(memory_format=channels_last)`` where the traced
operand is not), then re-runs fake-tensor propagation: eager's own stride rules carry channels-last
through the pointwise, BatchNorm, pooling and residual work between convolutions (TensorIterator
keeps its inputs' layout), the lowering realizes buffers in the traced layout
(``channels_last_stride``) and the scheduler orders loops by the stored layout
(``scheduler/loop_order.py``), so no transpose copy sits between two convolutions. Graph outputs get
eager's strides back (a user, or the backward graph that receives saved activations, may depend on
them): a copy is inserted only where the traced stride of an output changed.

``decide`` follows the spirit of torch inductor's ``decide_layout_opt``: channels-last pays on CUDA
for ordinary and depthwise convolutions, not for grouped convolutions with several input channels
per group, nor for graphs whose convolutions all have few channels or shrink channels. On the CPU it
pays in training graphs (oneDNN's NHWC convolutions and their backward) unless dense spatial
convolutions over many channels carry most of the FLOPs; CPU inference keeps NCHW.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kiln.graph import (
    annotations_of,
    autocast_off,
    log,
    shape_env_of,
    symbolic_dispatch,
    target_name,
)

from ..ir import is_dense
from ..ir.index import as_index
from ..ir.sizes import hint_of, substitute_hints

aten = torch.ops.aten
CONV = aten.convolution.default
CONV_BACKWARD = aten.convolution_backward.default
LAYOUT_MODES = ("auto", "channels_last", "keep")
# torch inductor's measured channels-last speed ratios (< 1 is faster), weighted by FLOPs
GROUPED, SMALL, IN_OUT, DEFAULT = 1.358, 0.783, 0.725, 0.823
# "auto" skips graphs whose NCHW conv-derived outputs hold more elements than this fraction of all
# convolution inputs (a training forward returning its saved activations; weight gradients are small)
MAX_RESTORED_FRACTION = 0.25
# auto for CUDA training graphs: off until BatchNorm's NHWC column reductions are split (see _auto)
TRAINING_CHANNELS_LAST = False
# CPU training graphs stay NCHW when more than this share of their convolution FLOPs is in dense spatial
# convolutions over more than CPU_WIDE_CHANNELS input channels (_auto says why)
CPU_DENSE_WIDE_SHARE, CPU_WIDE_CHANNELS = 0.5, 64


@dataclass(frozen=True, slots=True)
class LayoutDecision:
    channels_last: bool
    reason: str


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def conv_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """2-D convolutions (forward and backward) with traced 4-D operands."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in (CONV, CONV_BACKWARD):
            continue
        x = _val(n.args[1] if n.target is CONV_BACKWARD else n.args[0])
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            out.append(n)
    return out


def _operands(n: fx.Node) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """(input, weight, groups, transposed) of a forward or backward convolution."""
    a: Any = n.args
    if n.target is CONV_BACKWARD:
        return _val(a[1]), _val(a[2]), int(a[9]), bool(a[7])
    return _val(a[0]), _val(a[1]), int(a[8]), bool(a[6])


def _flops(n: fx.Node) -> float:
    x, w, _, _ = _operands(n)
    out = _val(n) if n.target is CONV else _val(n.args[0])  # backward: grad_output has the output's shape
    if isinstance(out, (tuple, list)) or not isinstance(out, torch.Tensor):
        return 0.0
    _, c_in, kh, kw = _weight_shape(w)
    return 2.0 * _numel(out) * c_in * kh * kw


def _weight_shape(w: torch.Tensor) -> tuple[int, ...]:
    """A weight's shape, symbolic sizes (a weight passed as a dynamic input) at their traced example
    values: the layout choice is a cost estimate, and comparing symbols would need guards."""
    return tuple(_hint(s) for s in w.shape)


def _dense_wide_share(convs: list[fx.Node]) -> float:
    """The share of the convolution FLOPs in dense (ungrouped) convolutions with a spatial kernel over
    more than ``CPU_WIDE_CHANNELS`` input channels."""
    total = wide = 0.0
    for n in convs:
        _, w, groups, _ = _operands(n)
        f = _flops(n)
        total += f
        _, c_in, kh, kw = _weight_shape(w)
        if groups == 1 and c_in > CPU_WIDE_CHANNELS and (kh > 1 or kw > 1):
            wide += f
    return wide / total if total > 0 else 0.0


def _kind(n: fx.Node) -> str:
    _, w, groups, _ = _operands(n)
    c_out, c_in, kh, _ = _weight_shape(w)
    if groups > 1 and c_in > 1:
        return "grouped"
    if c_out <= 64 and c_in <= 64:
        return "small"
    if c_out * 2 <= c_in and kh > 1:
        return "in_out"
    return "default"


def decide(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str, *,
           training_channels_last: bool = TRAINING_CHANNELS_LAST) -> LayoutDecision:
    """Whether this graph's convolutions should run channels-last, and why (logged by the pass).
    ``training_channels_last``: whether "auto" applies its channels-last rules to training graphs."""
    if mode not in LAYOUT_MODES:
        raise ValueError(f"InductorOptions.conv_layout={mode!r}: use one of {', '.join(LAYOUT_MODES)}")
    if mode == "keep":
        return LayoutDecision(False, "conv_layout='keep'")
    convs = conv_nodes(gm)
    if not convs:
        return LayoutDecision(False, "no 2-D convolution")
    if any(not isinstance(v, torch.Tensor) for n in convs for v in _operands(n)[:2]):
        return LayoutDecision(False, "a convolution operand without a traced value")
    if mode == "channels_last":
        return LayoutDecision(True, "conv_layout='channels_last'")
    return _auto(gm, convs, training_channels_last)


def _auto(gm: fx.GraphModule, convs: list[fx.Node], training_channels_last: bool) -> LayoutDecision:
    training = annotations_of(gm).layout_free_outputs is not None or any(n.target is CONV_BACKWARD for n in convs)
    on_cpu = any(_operands(n)[0].device.type != "cuda" for n in convs)
    if on_cpu and not training:
        # measured on the C++ path (benchmarks/results/layout.md): oneDNN inference convs did not get faster
        return LayoutDecision(False, "auto: inference convolutions on CPU keep NCHW (no measured gain)")
    if any(_operands(n)[3] for n in convs):
        return LayoutDecision(False, "auto: transposed convolution")
    if len(gm.graph.nodes) >= 300 * len(convs):
        return LayoutDecision(False, f"auto: only {len(convs)} convolutions in {len(gm.graph.nodes)} nodes")
    kinds = [_kind(n) for n in convs]
    conv_elems = sum(_numel(_operands(n)[0]) for n in convs)
    n_in, in_elems = _activation_inputs(gm)
    if in_elems > MAX_RESTORED_FRACTION * conv_elems:
        # a backward graph fed NCHW saved activations would mix layouts in every
        # BatchNorm/ReLU backward kernel (strided reads), where cuDNN transposes with tiled kernels
        return LayoutDecision(False, f"auto: {n_in} NCHW activation inputs feed pointwise work (saved "
                                     "activations of a forward kept NCHW)")
    if training and on_cpu:
        # oneDNN's NHWC training convolutions beat its NCHW ones on depthwise/grouped and narrow
        # convolutions (CPU training steps, benchmarks/RESULTS.md: HF ResNet with 16-128 channels 1.25x,
        # SqueezeNet 1.31x, MobileNetV2 1.14x, ShuffleNetV2 1.11x, EfficientNet-B0 1.07x), not on dense
        # spatial convolutions over many channels (ResNet-18 0.81x, ResNet-50 level). The share is the
        # same in the forward and the backward graph (FLOPs from the weights and the output's shape), so
        # both decide alike: the forward's saved outputs are layout-free, and the backward's weight
        # gradients are copied back to NCHW (small beside the activations)
        wide = _dense_wide_share(convs)
        if wide > CPU_DENSE_WIDE_SHARE:
            return LayoutDecision(False, f"auto: CPU training, {wide:.0%} of the convolution FLOPs in dense "
                                         f"spatial convolutions over > {CPU_WIDE_CHANNELS} channels "
                                         "(oneDNN's NCHW path is faster there)")
        return LayoutDecision(True, f"auto: CPU training convolutions (oneDNN's NHWC path; {wide:.0%} of the "
                                    "FLOPs in dense wide convolutions)")
    restored, copied = _activation_outputs(gm, convs)
    if copied > MAX_RESTORED_FRACTION * conv_elems:
        # a training forward whose saved activations must come back NCHW (nobody marked them
        # layout-free in GraphAnnotations): one transpose copy per saved activation eats the gain
        return LayoutDecision(False, f"auto: {restored} conv activations are graph outputs that would be "
                                     "copied back to NCHW (mark saved outputs in GraphAnnotations.layout_free_outputs)")
    # training (a backward graph, or a forward whose saved outputs are marked): channels-last training
    # graphs ran slower than eager on the H200 where NCHW ones are faster (benchmarks/RESULTS.md):
    # BatchNorm's statistics become column reductions, which kiln's Triton reductions do not split yet
    if training:
        if not training_channels_last:
            return LayoutDecision(False, "auto: training graphs keep NCHW (BatchNorm statistics over NHWC "
                                         "are column reductions; slower on the H200)")
        if "grouped" in kinds:
            return LayoutDecision(False, "auto: grouped convolution with >1 input channel per group")
        if "in_out" in kinds:
            return LayoutDecision(False, "auto: a convolution shrinks channels")
        if all(k == "small" for k in kinds):
            return LayoutDecision(False, "auto: every convolution has <= 64 channels")
        return LayoutDecision(True, "auto: training convolutions")
    pooled = _spatial_reduction_before_conv(gm, convs)
    if pooled is not None:
        # squeeze-excite (MobileNetV3): channels-last inference is slower than eager, NCHW faster
        return LayoutDecision(False, f"auto: {pooled} reduces over H and W before later convolutions "
                                     "(squeeze-excite): a column reduction in NHWC")
    flops = {"grouped": 0.0, "small": 0.0, "in_out": 0.0, "default": 0.0}
    for n, k in zip(convs, kinds):
        flops[k] += _flops(n)
    total = sum(flops.values())
    weighted = (flops["grouped"] * GROUPED + flops["small"] * SMALL + flops["in_out"] * IN_OUT
                + flops["default"] * DEFAULT)
    if weighted > total:
        return LayoutDecision(False, f"auto: FLOP-weighted estimate {weighted / total:.2f}x (slower)")
    return LayoutDecision(True, f"auto: FLOP-weighted estimate {weighted / max(total, 1.0):.2f}x")


_SPATIAL_REDUCTIONS = {"aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default",
                       "aten.var_mean.correction", "aten.var.correction"}


def _spatial_reduction_before_conv(gm: fx.GraphModule, convs: list[fx.Node]) -> str | None:
    """The first node reducing a 4-D value over both H and W that a later convolution follows in the
    graph's (topological) order, or None."""
    remaining = len(convs)
    is_conv = set(convs)
    for n in gm.graph.nodes:
        remaining -= n in is_conv
        if not remaining:
            return None
        if n.op != "call_function" or target_name(n.target) not in _SPATIAL_REDUCTIONS or len(n.args) < 2:
            continue
        v = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
        dims = n.args[1] if isinstance(n.args[1], (list, tuple)) else [n.args[1]]
        if isinstance(v, torch.Tensor) and v.dim() == 4 and {d % 4 for d in dims if isinstance(d, int)} >= {2, 3}:
            return n.name
    return None


def _activation_outputs(gm: fx.GraphModule, convs: list[fx.Node]) -> tuple[int, int]:
    """How many graph outputs (not marked layout-free) are 4-D NCHW values computed from a
    convolution, and their elements: each would need a copy back to NCHW after the conversion."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat, _ = torch.utils._pytree.tree_flatten(out.args[0])
    free = frozenset(annotations_of(gm).layout_free_outputs or ())
    downstream: set[fx.Node] = set()
    stack = list(convs)
    while stack:
        n = stack.pop()
        if n not in downstream:
            downstream.add(n)
            stack.extend(n.users)
    count = elems = 0
    for k, a in enumerate(flat):
        v = _val(a)
        if (not _layout_free(k, v, free) and a in downstream and isinstance(v, torch.Tensor) and v.dim() == 4
                and v.is_floating_point() and not _is_channels_last(v)):
            count, elems = count + 1, elems + _numel(v)
    return count, elems


def _activation_inputs(gm: fx.GraphModule) -> tuple[int, int]:
    """4-D NCHW floating-point placeholders read by more than convolutions (which convert their
    operands once), and their elements: pointwise kernels would read them across the NHWC loops.
    Returning a placeholder (a training forward saves its image and weights) reads nothing."""
    count = elems = 0
    for n in gm.graph.nodes:
        v = n.meta.get("val") if n.op == "placeholder" else None
        if not isinstance(v, torch.Tensor) or v.dim() != 4 or not v.is_floating_point() or _is_channels_last(v):
            continue
        if _read_only_by_convolutions(n):
            continue
        count, elems = count + 1, elems + _numel(v)
    return count, elems


_ALIASES = (aten.detach.default, aten.alias.default)
_METADATA = (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default)


def _read_only_by_convolutions(n: fx.Node) -> bool:
    """Whether every use of ``n`` is a convolution, the graph's output, a size query (symbolic
    shapes), or an alias of ``n`` (detach) used only so."""
    return all(u.op == "output" or u.target in (CONV, CONV_BACKWARD) or u.target in _METADATA
               or (u.target in _ALIASES and _read_only_by_convolutions(u)) for u in n.users)


def _is_channels_last(v: torch.Tensor) -> bool:
    """Whether a 4-D value is laid out channels-last; with symbolic sizes, for every size (compared as
    expressions: asking the SymInts would add guards)."""
    if not _symbolic(v):
        return v.is_contiguous(memory_format=torch.channels_last)
    return _strides_match(v, (1, 3, 2, 0))


def _is_contiguous(v: torch.Tensor) -> bool:
    return v.is_contiguous() if not _symbolic(v) else _strides_match(v, (3, 2, 1, 0))


def _strides_match(v: torch.Tensor, order: tuple[int, ...]) -> bool:
    """Whether ``v``'s strides are the dense strides of its shape with dims ``order`` innermost first
    (a dim of static size 1 may have any stride)."""
    shape, stride = [as_index(x) for x in v.shape], [as_index(x) for x in v.stride()]
    expect: sympy.Expr = sympy.Integer(1)
    for d in order:
        if shape[d] != 1 and sympy.expand(stride[d] - expect) != 0:
            return False
        expect = sympy.expand(expect * shape[d])
    return True


def _symbolic(v: torch.Tensor) -> bool:
    return any(isinstance(x, torch.SymInt) for x in (*v.shape, *v.stride()))


def _numel(v: torch.Tensor) -> int:
    """Elements of ``v``, symbolic sizes at their traced example values (for cost estimates only)."""
    n = 1
    for x in v.shape:
        n *= _hint(x)
    return n


def _hint(x: Any) -> int:
    if isinstance(x, torch.SymInt):
        hint = getattr(x.node, "hint", None)
        return hint if isinstance(hint, int) else 1
    return int(x)


def channels_last_stride(node: fx.Node) -> tuple[Any, ...] | None:
    """The traced stride of a 4-D value laid out channels-last (and not also contiguous), else None:
    what the lowering gives the buffer when it realizes this node's value (ints or SymInts)."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.layout != torch.strided:
        return None
    if _is_contiguous(v) or not _is_channels_last(v):
        return None
    return tuple(v.stride())


def _to_channels_last(gm: fx.GraphModule, conv: fx.Node, position: int) -> bool:
    a = conv.args[position]
    v = _val(a)
    if not isinstance(a, fx.Node) or not isinstance(v, torch.Tensor) or _is_channels_last(v):
        return False
    with gm.graph.inserting_before(conv):
        c = gm.graph.call_function(aten.clone.default, (a,), {"memory_format": torch.channels_last})
    _replace_arg(conv, position, c)
    return True


def _drop_redundant_clones(gm: fx.GraphModule) -> int:
    """Remove the conversions that propagation made no-ops; returns how many.

    Operands are chosen on the traced (NCHW) values, but once the earlier convolutions run
    channels-last their outputs, and the BatchNorm/ReLU/residual work after them, already are: a
    clone of a channels-last value would store the activation a second time. In ResNet-50 the
    scheduler then computed a block's output into the clone for the next convolution and recomputed
    it, from the two un-normalized convolution outputs it read, for the residual add: three 49 MB
    activations alive where eager holds one (bf16, batch 32)."""
    dropped = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.clone.default:
            continue
        if n.kwargs.get("memory_format") is not torch.channels_last or not all(u.target in (CONV, CONV_BACKWARD)
                                                                             for u in n.users):
            continue
        src, v = n.args[0], _val(n.args[0])
        if isinstance(src, fx.Node) and isinstance(v, torch.Tensor) and _is_channels_last(v):
            n.replace_all_uses_with(src)
            gm.graph.erase_node(n)
            dropped += 1
    return dropped


def _replace_arg(n: fx.Node, position: int, new: fx.Node) -> None:
    args = list(n.args)
    args[position] = new
    n.args = tuple(args)


def _restore_output_strides(gm: fx.GraphModule, before: dict[int, tuple[Any, ...]]) -> int:
    """Copy outputs whose traced stride changed back to eager's (dense) stride; returns the count.

    Outputs listed in ``GraphAnnotations.layout_free_outputs`` with static strides are exempt: only a
    later compiled graph reads them (saved activations), and whoever set the mark reads
    ``CompiledGraph.output_strides`` to compile that graph for the layout they really have."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat, spec = torch.utils._pytree.tree_flatten(out.args[0])
    free = frozenset(annotations_of(gm).layout_free_outputs or ())
    fixed = 0
    for k, a in enumerate(flat):
        v = _val(a)
        old = before.get(k)
        if _layout_free(k, v, free) or old is None or not isinstance(v, torch.Tensor) or _stride_key(v) == old:
            continue
        order = sorted(range(v.dim()), key=lambda d: (-_expr_hint(old[d], v), d))  # eager's dims, outermost first
        inverse = [order.index(d) for d in range(v.dim())]
        with gm.graph.inserting_before(out):
            x = a
            if order != list(range(v.dim())):
                x = gm.graph.call_function(aten.permute.default, (x, order))
            x = gm.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
            if order != list(range(v.dim())):
                x = gm.graph.call_function(aten.permute.default, (x, inverse))
        flat[k] = x
        fixed += 1
    out.args = (torch.utils._pytree.tree_unflatten(flat, spec),)
    return fixed


def _layout_free(k: int, v: Any, free: frozenset[int]) -> bool:
    """Whether output ``k`` (value ``v``) may keep the layout the rewrite gave it: it is marked
    layout-free and its strides are ints (a symbolic batch alone leaves them so). ``CompiledGraph.output_strides`` reports symbolic strides
    as None, so the graph reading a symbolic-size output would be compiled for the traced (NCHW)
    strides while it gets channels-last ones: its backward read every saved activation transposed."""
    return k in free and isinstance(v, torch.Tensor) and not any(isinstance(x, torch.SymInt) for x in v.stride())


def output_strides(gm: fx.GraphModule) -> dict[int, tuple[Any, ...]]:
    """Strides of the graph's dense tensor outputs by flat output position (from ``meta['val']``):
    ints, or sympy expressions where sizes are symbolic."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat, _ = torch.utils._pytree.tree_flatten(out.args[0])
    strides = {}
    for k, a in enumerate(flat):
        v = _val(a)
        if isinstance(v, torch.Tensor) and v.layout == torch.strided:
            key = _stride_key(v)
            if is_dense(tuple(as_index(x) for x in v.shape) if _symbolic(v) else v.shape, key):
                strides[k] = key
    return strides


def _stride_key(v: torch.Tensor) -> tuple[Any, ...]:
    """``v``'s strides as ints, or as sympy expressions where symbolic (equal exactly when they are the
    same expressions: no guard)."""
    return tuple(as_index(x) if isinstance(x, torch.SymInt) else int(x) for x in v.stride())


def _expr_hint(e: Any, v: torch.Tensor) -> int:
    """A stride expression's value at the traced example sizes (for ordering dims only)."""
    if isinstance(e, int):
        return e
    sym = next((x for x in (*v.shape, *v.stride()) if isinstance(x, torch.SymInt)), None)
    return int(substitute_hints(sympy.sympify(e), hint_of(sym)))  # kiln's size symbols keep torch's names


def to_channels_last(gm: fx.GraphModule, example_inputs: Sequence[Any],
                     eager_strides: dict[int, tuple[int, ...]] | None = None) -> int:
    """Rewrite ``gm`` in place (see the module doc); returns how many operands were converted.

    Outputs get ``eager_strides`` (``output_strides`` of the graph as the caller traced it, before
    decompositions re-traced it) back, even where the placeholders now say otherwise."""
    before = eager_strides if eager_strides is not None else output_strides(gm)
    # placeholders may carry other strides than the graph was traced with (a backward graph compiled
    # for channels-last saved activations): node metas follow the placeholders from here on
    ran = repropagate(gm, example_inputs)
    converted = 0
    for conv in conv_nodes(gm):
        positions = (0, 1, 2) if conv.target is CONV_BACKWARD else (0, 1)
        for p in positions:
            converted += _to_channels_last(gm, conv, p)
    if converted:
        ran = repropagate(gm, example_inputs, ran)
        converted -= _drop_redundant_clones(gm)
    restored = restore_output_strides(gm, example_inputs, before, ran)
    log("perf_hints").info("layout: %d convolution operands made channels-last, %d outputs copied back to "
                           "eager's strides", converted, restored)
    return converted


def restore_output_strides(gm: fx.GraphModule, example_inputs: Sequence[Any],
                           eager_strides: dict[int, tuple[int, ...]], ran: Propagated | None = None) -> int:
    """Copy outputs whose traced stride differs from ``eager_strides`` back to it (see
    ``_restore_output_strides``); returns the count. A no-op when nothing differs. ``ran``: the
    last ``repropagate`` of ``gm``'s record."""
    restored = _restore_output_strides(gm, eager_strides)
    if restored:
        repropagate(gm, example_inputs, ran)
    gm.graph.lint()
    gm.recompile()
    return restored


def _fake_mode(gm: fx.GraphModule) -> FakeTensorMode:
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


# per node of a repropagated graph: (the values of its inputs it was run on, the value it gave)
Propagated = dict[fx.Node, tuple[tuple[Any, ...], Any]]


def repropagate(gm: fx.GraphModule, example_inputs: Sequence[Any], ran: Propagated | None = None) -> Propagated:
    """Recompute ``meta['val']`` of every node from the placeholders' (strides changed upstream).

    A ``view`` whose input is no longer viewable (a flatten of a channels-last activation) gets the
    meta of a view of a contiguous copy: the lowering folds views of any layout (copying if needed).
    ``ran``: what an earlier repropagate of this graph returned; a node it ran on the very same input
    values (objects), and whose value is still the one it gave, keeps that value instead of running
    on fake tensors again (the rewrites between two passes touch a few nodes). Returns the record.
    """
    mode = _fake_mode(gm)
    env: dict[fx.Node, Any] = {}
    it = iter(example_inputs)
    record: Propagated = {}

    def fake(x: Any) -> Any:  # real tensors and other modes' fakes (the graph came from two traces)
        if isinstance(x, torch.Tensor) and not (isinstance(x, FakeTensor) and x.fake_mode is mode):
            return mode.from_tensor(x)
        return x

    symbolic = shape_env_of([*(n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"), *example_inputs])
    with mode, autocast_off(), symbolic_dispatch(symbolic is not None):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                v, ex = n.meta.get("val"), next(it, None)
                env[n] = fake(v if v is not None else ex)
            elif n.op == "get_attr":
                env[n] = fake(getattr(gm, n.target))
            elif n.op == "call_function":
                inputs = tuple(env[a] for a in n.all_input_nodes)
                before = ran.get(n) if ran is not None else None
                if before is not None and before[1] is n.meta.get("val") and len(before[0]) == len(inputs) \
                        and all(x is y for x, y in zip(before[0], inputs)):
                    env[n] = before[1]
                else:
                    env[n] = _run(n, env)
                record[n] = (inputs, env[n])
            else:
                continue
            n.meta["val"] = env[n]
    return record


def _run(n: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args: Any = fx.node.map_arg(n.args, lambda a: env[a])
    kwargs: Any = fx.node.map_arg(n.kwargs, lambda a: env[a])
    target: Any = n.target
    if target is operator.getitem:
        return args[0][args[1]]
    try:
        return target(*args, **kwargs)
    except Exception as e:
        if n.target in (aten.view.default, aten._unsafe_view.default) and isinstance(args[0], torch.Tensor):
            return target(args[0].contiguous(), *args[1:], **kwargs)
        old = n.meta.get("val")
        if old is None:
            raise
        # fake tensors cannot run it (data-dependent output): its traced meta stands; the lowering
        # reads the layouts of its tensor arguments from their own values, not from this meta
        log("perf_hints").debug("layout: keeping the traced meta of %s (%s)", n.name, e)
        return old
