"""kiln.inductor's passes: each maps the frozen compile state to the next. pipeline.py lists them, per
backend, in the order they run."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch import fx

from kiln.graph import annotations_of, enabled, keeping_texts, log, print_graph

from . import decomp_bridge
from .autotune import GeneratedKernelTuner, kernel_problems, make_session
from .autotune.matmul_template_kernel import smem_limit
from .codegen.common import CompiledKernels
from .codegen.cpp import CppBackend
from .codegen.triton.backend import KernelTuner, TritonBackend
from .codegen.triton.group import TRITON_GROUP_PARAMS, groupable_triton
from .codegen.triton.kernel import generate_kernels as triton_kernels_for
from .codegen.wrapper import wrapper_source
from .decode_attention import template_decode_attention
from .graph_passes.conv_bias import split_conv_bias
from .graph_passes.conv_layout import (
    decide,
    output_strides,
    restore_output_strides,
    to_channels_last,
)
from .graph_passes.cse import eliminate_common_subexpressions
from .graph_passes.gemv_as_reduction import rewrite_gemv
from .graph_passes.pad_matmuls import pad_misaligned_matmuls
from .graph_passes.reinplace import reinplace_input_mutations
from .graph_passes.stems import pad_stem_channels, rewrite_patch_convs
from .index_width import INDEX32_REASON, index_guard
from .ir import DynamicShapeUnsupported, LoopProgram, ScheduledProgram
from .lowering.lower import lower_graph
from .matmul_templates import count_matmul_sites, select_templates, template_misaligned_matmuls
from .options import InductorOptions
from .recompute_scalars import recompute_scalar_reductions
from .scheduler import eliminate_dead_code, schedule
from .scheduler.horizontal import group_kernels
from .scheduler.inplace import plan_inplace_reuse, plan_inplace_scatters, plan_inplace_updates
from .size_guards import GuardWatch
from .split_reductions import split_reductions

_NAME = re.compile(r"[A-Za-z_]\w*")
_PY_WORDS = {"and", "or", "not", "max", "min", "True", "False"}


@dataclass(frozen=True)
class CompileState:
    """One compile between two passes. The graph module is FX's mutable object (graph passes rewrite
    it in place); every other field is replaced, never changed, by the pass that produces it."""

    gm: fx.GraphModule
    example_inputs: tuple[object, ...]
    options: InductorOptions
    name: str
    backend: CppBackend | TritonBackend  # chosen once, when the compile starts (pipeline.choose_backend)
    guards: GuardWatch | None = None  # symbolic sizes: what this compile added to the ShapeEnv (size_guards.py)
    traced_output_strides: Mapping[int, tuple[Any, ...]] = field(default_factory=dict)  # the caller's contract
    program: LoopProgram | None = None
    scheduled: ScheduledProgram | None = None
    tuner: KernelTuner | None = None  # max-autotune's tuner for this compile (matmul_templates)
    kernels: CompiledKernels | None = None
    wrapper: str = ""
    fallbacks: tuple[str, ...] = ()
    texts: Mapping[str, str] = field(default_factory=dict)

    def with_text(self, key: str, text: str) -> CompileState:
        return replace(self, texts={**self.texts, key: text})


def triton(s: CompileState) -> TritonBackend:
    """The compile's backend, in passes only the Triton stage list runs (for its device and config)."""
    if not isinstance(s.backend, TritonBackend):
        raise TypeError(f"a Triton pass ran in a {s.backend.name} compile: pipeline.stages_for lists it")
    return s.backend


# ---- graph passes (torch.fx, before lowering) ----

def propagate_meta(s: CompileState) -> CompileState:
    """Fill node.meta['val'] with fake tensors when the graph came without them."""
    decomp_bridge.ensure_meta(s.gm, s.example_inputs)
    return replace(s, traced_output_strides=output_strides(s.gm))  # before decompositions re-trace the graph


def decompose(s: CompileState) -> CompileState:
    """Rewrite non-core ops with kiln.decomp's "inductor" table (when kiln.decomp provides it)."""
    gm = decomp_bridge.decompose(s.gm, s.example_inputs)
    if gm is not s.gm:  # the caller's GraphAnnotations survive the re-trace
        gm.meta.update({k: v for k, v in s.gm.meta.items() if k not in gm.meta})
    s = replace(s, gm=gm)
    if keeping_texts():  # the compile report and KILN_DEBUG_DIR show the program lowering starts from
        s = s.with_text("core_aten", print_graph(gm))
    return s


def common_subexpressions(s: CompileState) -> CompileState:
    """Equal pure ATen calls on equal arguments computed once (graph_passes/cse.py says why)."""
    removed = eliminate_common_subexpressions(s.gm)
    if removed:
        log("perf_hints").debug("graph %s: %d repeated computations merged", s.name, removed)
    return s


def conv_layout(s: CompileState) -> CompileState:
    """Convolution graphs go channels-last when ``options.conv_layout`` says so (graph_passes/conv_layout.py)."""
    decision = decide(s.gm, s.example_inputs, s.options.conv_layout)
    traced = dict(s.traced_output_strides)
    if decision.channels_last:
        to_channels_last(s.gm, s.example_inputs, traced)
    elif output_strides(s.gm) != traced:
        # placeholders with other strides than the trace (a caller compiling a backward graph for
        # its forward's real output strides): outputs still keep the strides the caller traced
        restore_output_strides(s.gm, s.example_inputs, traced)
    if decision.reason != "no 2-D convolution":
        log("perf_hints").info("graph %s: conv layout %s (%s)", s.name,
                               "channels-last" if decision.channels_last else "as traced", decision.reason)
    return s


def _fx_rewrite(s: CompileState, enabled: bool, rewrite: Callable[[fx.GraphModule], int]) -> CompileState:
    """Run a graph rewrite; the nodes it made get their metadata."""
    if enabled and rewrite(s.gm):
        decomp_bridge.ensure_meta(s.gm, s.example_inputs)
    return s


def patch_convs(s: CompileState) -> CompileState:
    """Patch-embedding stems on CUDA become matrix products (graph_passes/stems.py says why)."""
    return _fx_rewrite(s, s.options.rewrite_stems, rewrite_patch_convs)


def pad_stems(s: CompileState) -> CompileState:
    """Channels-last half-precision stems on CUDA get 8 zero-padded channels (graph_passes/stems.py says why)."""
    return _fx_rewrite(s, s.options.rewrite_stems, pad_stem_channels)


def conv_bias(s: CompileState) -> CompileState:
    """Convolutions' bias adds fused into their consumers' kernels (graph_passes/conv_bias.py says why)."""
    devices = s.options.conv_bias_devices
    return _fx_rewrite(s, bool(devices), lambda gm: split_conv_bias(gm, devices))


def small_matmuls(s: CompileState) -> CompileState:
    """One-row matmuls become fused reductions (graph_passes/gemv_as_reduction.py says why)."""
    return _fx_rewrite(s, s.options.gemv_as_reduction, rewrite_gemv)


def pad_matmuls(s: CompileState) -> CompileState:
    """Large CUDA matmuls with a misaligned M, N or K run on zero-padded operands (graph_passes/pad_matmuls.py
    says why), except those the Triton template takes after scheduling (``misaligned_matmuls``)."""
    r = s.options.misaligned_matmuls
    return _fx_rewrite(s, s.options.pad_matmuls, lambda gm: pad_misaligned_matmuls(
        gm, devices=r.devices, min_macs=r.min_macs, min_dim=r.min_dim, template=r.template))


def reinplace(s: CompileState) -> CompileState:
    """Inputs the graph mutates by index_put are updated in place (graph_passes/reinplace.py)."""
    if s.options.reinplace_mutations:
        reinplace_input_mutations(s.gm)
    return s


# ---- loop-level passes ----

def lower(s: CompileState) -> CompileState:
    """The graph as a ``LoopProgram`` (lowering/, one module per op family)."""
    device = s.backend.device if isinstance(s.backend, TritonBackend) else "cpu"
    program, fallbacks = lower_graph(s.gm, list(s.example_inputs), s.options, s.name, device)
    text = program.as_text()
    log("ir_pre_fusion").info("%s", text)
    return replace(s, program=program, fallbacks=tuple(fallbacks)).with_text("ir_pre_fusion", text)


def index_width(s: CompileState) -> CompileState:
    """Symbolic Triton kernels index in 32 bits under one guard on the tensors' extents (index_width.py)."""
    assert s.program is not None
    if not s.program.sizes or not s.options.index32_limit:
        return s
    mark = s.guards.mark() if s.guards is not None else 0
    guard = index_guard(s.gm, s.example_inputs, s.options.index32_limit)
    if guard is None:
        log("perf_hints").info("graph %s: symbolic sizes without a 32-bit guard: kernels index in 64 bits", s.name)
        return s
    log("perf_hints").info("graph %s: kernels index in 32 bits under the guard %s", s.name, guard)
    made = s.guards.since(mark, INDEX32_REASON) if s.guards is not None else ()
    return replace(s, program=replace(s.program, index_bits=32, size_guards=(*s.program.size_guards, *made)))


def remove_dead_code(s: CompileState) -> CompileState:
    assert s.program is not None
    return replace(s, program=eliminate_dead_code(s.program))


def recompute_scalars(s: CompileState) -> CompileState:
    """Scalar reductions (an RMSNorm's statistic) computed again by the reductions over the same range that
    read them, in their kernel (recompute_scalars.py)."""
    assert s.program is not None
    if not s.options.recompute_scalars:
        return s
    program, count = recompute_scalar_reductions(s.program)
    if count:
        log("perf_hints").info("graph %s: %d scalar reduction(s) recomputed in the reductions that read them",
                               s.name, count)
    return replace(s, program=program)


def split_long_reductions(s: CompileState) -> CompileState:
    """Reductions of few outputs over many elements run in two passes (split_reductions.py)."""
    assert s.program is not None
    if not s.options.split_reductions:
        return s
    program, count = split_reductions(s.program)
    if count:
        log("perf_hints").info("graph %s: %d long reduction(s) split into partial + final passes", s.name, count)
    return replace(s, program=program)


def fuse_and_plan(s: CompileState) -> CompileState:
    """Dependencies, fusion, kernel building, ordering and memory planning (the scheduler)."""
    assert s.program is not None
    sched = schedule(s.program, s.options)
    if enabled("ir_post_fusion"):  # texts["ir_post_fusion"] is the final schedule's (inplace_updates)
        log("ir_post_fusion").info("%s", sched.as_text())
    return replace(s, scheduled=sched)


def decode_attention(s: CompileState) -> CompileState:
    """Attention of one query row per head (a decode step) as kiln's Triton kernel: one program per
    (batch, head) streams the cache, skipping positions the mask removes (decode_attention.py)."""
    if s.scheduled is None or not s.options.decode_attention:
        return s
    sched, n = template_decode_attention(s.scheduled)
    if n:
        log("perf_hints").info("decode attention: %d attention call(s) as kiln's one-query Triton kernel", n)
        if enabled("ir_post_fusion"):
            log("ir_post_fusion").info("%s", sched.as_text())
    return replace(s, scheduled=sched)


def misaligned_matmuls(s: CompileState) -> CompileState:
    """Large matmuls whose result rows are not 16-byte multiples (GPT-2's and BERT's LM heads) run as
    kiln's Triton matmul template, untuned, with masked stores straight into the unaligned result and
    their pointwise consumer fused (matmul_templates.py ``template_misaligned_matmuls``). In every mode:
    max-autotune does not time them again (the untuned configuration is the fastest measured there)."""
    r = s.options.misaligned_matmuls
    backend = triton(s)
    if s.scheduled is None or not r.template or backend.device not in r.devices:
        return s
    smem = smem_limit(backend.device, s.options.autotune.cross_target)
    sched, n = template_misaligned_matmuls(s.scheduled, r, smem)
    if n and enabled("ir_post_fusion"):
        log("ir_post_fusion").info("%s", sched.as_text())
    return replace(s, scheduled=sched)


def matmul_templates(s: CompileState) -> CompileState:
    """max-autotune: start the compile's tuning session (autotune/session.py) and choose for each static
    mm/addmm/bmm between cuBLAS and a Triton template with its pointwise consumer fused
    (matmul_templates.py). The generated kernels' configurations are registered too, so every candidate of
    the program compiles in one parallel batch; they are timed in ``generate_kernels`` if they survive."""
    if not s.options.max_autotune or s.scheduled is None:
        return s
    backend = triton(s)
    n = count_matmul_sites(s.scheduled) if s.options.autotune.matmul_templates else 0
    session = make_session(s.options.autotune, backend.device)
    if session is None:
        if n:
            log("perf_hints").info("max-autotune: no CUDA device here (cross-compiling or the interpreter): %d "
                                   "matmul(s) stay cuBLAS externs; compile on the target GPU to tune them "
                                   "(KILN_AUTOTUNE_CROSS_TARGET=cuda:90 measures what tuning would compile)", n)
        return s
    assert s.program is not None
    generated = [g for k in s.scheduled.kernels() for g in triton_kernels_for(k, backend.cfg)]
    kernel_problems(generated, s.program.layouts(), backend.device, session, wanted=False)
    sched = select_templates(s.scheduled, s.options, backend.device, session) if n else s.scheduled
    if sched is not s.scheduled and enabled("ir_post_fusion"):
        log("ir_post_fusion").info("%s", sched.as_text())
    return replace(s, scheduled=sched, tuner=GeneratedKernelTuner(session))


def inplace_updates_cpp(s: CompileState) -> CompileState:
    """Mutated inputs, and intermediates dying in a pointwise kernel, written over by the kernel that
    computes their successor (scheduler/inplace.py): the C++ writer orders each loop point's stores
    after its loads."""
    assert s.scheduled is not None
    sched = s.scheduled
    if s.options.reinplace_mutations:
        mutations = annotations_of(s.gm).input_mutations
        sched = plan_inplace_updates(plan_inplace_scatters(sched, mutations), mutations)
    return replace(s, scheduled=plan_inplace_reuse(sched))  # group_independent_kernels finishes it


def group_independent_kernels(s: CompileState) -> CompileState:
    """C++: runs of independent pointwise kernels launched as one group, one parallel region over their
    flattened ranges (scheduler/horizontal.py)."""
    assert s.scheduled is not None
    sched = s.scheduled
    if s.options.group_kernels and s.options.fuse:
        sched = group_kernels(sched)
    return _final_schedule(s, sched)


def inplace_updates_triton(s: CompileState) -> CompileState:
    """Mutated inputs written over by the kernel computing their new value where it is their only reader
    (BatchNorm's running statistics, an optimizer's states), and intermediates dying in a pointwise kernel
    written over by the kernel computing their successor, for kernels with one store only
    (scheduler/inplace.py)."""
    assert s.scheduled is not None
    sched = s.scheduled
    if s.options.reinplace_mutations:
        mutations = annotations_of(s.gm).input_mutations
        sched = plan_inplace_updates(plan_inplace_scatters(sched, mutations), mutations, sole_reader=True)
    return replace(s, scheduled=plan_inplace_reuse(sched, single_store=True))  # group_triton_kernels finishes it


def group_triton_kernels(s: CompileState) -> CompileState:
    """Triton: runs of independent flat kernels (pointwise, in-place scatters) launched as one kernel whose
    programs are split between them (codegen/triton/group.py)."""
    assert s.scheduled is not None
    sched = s.scheduled
    if s.options.group_kernels and s.options.fuse:
        sched = group_kernels(sched, groupable_triton, TRITON_GROUP_PARAMS)
    return _final_schedule(s, sched)


def _final_schedule(s: CompileState, sched: ScheduledProgram) -> CompileState:
    # the schedule is final here: its text is made once (a large program's text is costly)
    return replace(s, scheduled=sched).with_text("ir_post_fusion", sched.as_text())


# ---- code generation ----

def generate_cpp_kernels(s: CompileState) -> CompileState:
    """One C++/OpenMP shared library for the graph's kernels (codegen/cpp/), cached by source hash."""
    assert s.scheduled is not None and s.program is not None
    return replace(s, kernels=s.backend.compile(s.scheduled, s.program.layouts(), s.options))


def generate_triton_kernels(s: CompileState) -> CompileState:
    """One Triton module (codegen/triton/), tuned by max-autotune's session when matmul_templates
    started one; the final kernels start compiling in worker processes."""
    assert s.scheduled is not None and s.program is not None
    return replace(s, kernels=triton(s).compile(s.scheduled, s.program.layouts(), s.options, tuner=s.tuner))


def generate_wrapper(s: CompileState) -> CompileState:
    """The Python module that allocates, launches and frees (codegen/wrapper.py)."""
    assert s.scheduled is not None and s.kernels is not None
    s = _with_size_guards(s)
    assert s.scheduled is not None and s.kernels is not None
    src = wrapper_source(s.scheduled, s.kernels, arena=s.options.memory_arena)
    text = src + ("\n# ---- kernels ----\n" + s.kernels.source_text if s.kernels.source_text else "")
    log("output_code").info("%s", text)
    return replace(s, wrapper=src).with_text("output_code", text)


def _with_size_guards(s: CompileState) -> CompileState:
    """The relations this compile assumed about symbolic sizes, on the program the wrapper checks."""
    if s.guards is None or s.program is None or s.scheduled is None:
        return s
    added = s.guards.added(s.name)
    if not added:
        return s
    bound = {z.symbol for z in s.program.sizes}
    for g in added:
        unbound = sorted(set(_NAME.findall(g.expr)) - bound - _PY_WORDS)
        if unbound:  # specialised before lowering: no input size is that symbol any more
            raise DynamicShapeUnsupported(
                f"graph {s.name!r}: a compile step assumed {g.expr} ({g.reason}), over size symbol(s) "
                f"{', '.join(unbound)} the wrapper cannot read from the inputs")
    program = replace(s.program, size_guards=tuple(dict.fromkeys((*s.program.size_guards, *added))))
    return replace(s, program=program, scheduled=replace(s.scheduled, program=program))
