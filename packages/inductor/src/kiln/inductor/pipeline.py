"""kiln.inductor's pipeline, top to bottom. Each pass maps the compile state to the next."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from kiln.graph import Pass, annotations_of, enabled, keeping_texts, log, print_graph

from . import decomp_bridge
from .autotune import TuningSession, make_session
from .codegen.common import CompiledKernels, KernelBackend
from .codegen.cpp import CppBackend
from .codegen.triton.backend import TritonBackend, kernel_problems
from .codegen.triton.kernel import generate_kernels as generate_triton_kernels
from .codegen.wrapper import wrapper_source
from .dynamic import GuardWatch
from .gemv import rewrite_gemv
from .ir import LoopProgram, ScheduledProgram, verify_program, verify_schedule
from .layout import decide, output_strides, restore_output_strides, to_channels_last
from .lowering.lower import lower_graph
from .mm_templates import count_matmul_sites, select_templates
from .options import InductorOptions
from .padmm import pad_misaligned_matmuls
from .reinplace import reinplace_input_mutations
from .scheduler import eliminate_dead_code, schedule
from .scheduler.horizontal import group_kernels
from .scheduler.inplace import plan_inplace_reuse, plan_inplace_updates
from .split_reductions import split_reductions
from .stems import pad_stem_channels, rewrite_patch_convs


@dataclass
class CompileState:
    gm: fx.GraphModule
    example_inputs: Sequence[Any]
    options: InductorOptions
    name: str
    program: LoopProgram | None = None
    scheduled: ScheduledProgram | None = None
    kernels: CompiledKernels | None = None
    wrapper: str = ""
    fallbacks: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    traced_output_strides: dict[int, tuple[int, ...]] = field(default_factory=dict)  # the caller's contract
    tuning: TuningSession | None = None  # max-autotune's session for this compile (matmul_templates)
    guards: GuardWatch | None = None  # symbolic sizes: what this compile added to the ShapeEnv (dynamic.py)
    backend: KernelBackend | None = None  # chosen once, when the compile starts (choose_backend)

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = choose_backend(self.example_inputs, self.options)


def choose_backend(example_inputs: Sequence[Any], options: InductorOptions) -> KernelBackend:
    """Triton for CUDA inputs (real or fake: sources are generated, not run), else the CPU choice."""
    if any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs):
        return TritonBackend("cuda")
    if options.cpu_backend == "triton":
        return TritonBackend("cpu")
    if options.cpu_backend != "cpp":
        raise ValueError(f"InductorOptions.cpu_backend={options.cpu_backend!r}: use 'cpp' or 'triton'")
    return CppBackend()


def backend_for(state: CompileState) -> KernelBackend:
    """The compile's kernel backend (chosen once, in CompileState)."""
    assert state.backend is not None
    return state.backend


def propagate_meta(s: CompileState) -> CompileState:
    """Fill node.meta['val'] with fake tensors when the graph came without them."""
    decomp_bridge.ensure_meta(s.gm, s.example_inputs)
    s.traced_output_strides = output_strides(s.gm)  # before decompositions re-trace the graph
    return s


def decompose(s: CompileState) -> CompileState:
    """Rewrite non-core ops with kiln.decomp's "inductor" table (when kiln.decomp provides it)."""
    gm = decomp_bridge.decompose(s.gm, s.example_inputs)
    if gm is not s.gm:  # the caller's GraphAnnotations survive the re-trace
        gm.meta.update({k: v for k, v in s.gm.meta.items() if k not in gm.meta})
    if keeping_texts():  # the compile report and KILN_DEBUG_DIR show the program lowering starts from
        s.texts["core_aten"] = print_graph(gm)
    return replace(s, gm=gm)


def conv_layout(s: CompileState) -> CompileState:
    """Convolution graphs go channels-last when ``options.conv_layout`` says so (layout.py)."""
    decision = decide(s.gm, s.example_inputs, s.options.conv_layout)
    if decision.channels_last:
        to_channels_last(s.gm, s.example_inputs, s.traced_output_strides)
    elif output_strides(s.gm) != s.traced_output_strides:
        # placeholders with other strides than the trace (a caller compiling a backward graph for
        # its forward's real output strides): outputs still keep the strides the caller traced
        restore_output_strides(s.gm, s.example_inputs, s.traced_output_strides)
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
    """Patch-embedding stems on CUDA become matrix products (stems.py says why)."""
    return _fx_rewrite(s, s.options.rewrite_stems, rewrite_patch_convs)


def pad_stems(s: CompileState) -> CompileState:
    """Channels-last half-precision stems on CUDA get 8 zero-padded channels (stems.py says why)."""
    return _fx_rewrite(s, s.options.rewrite_stems, pad_stem_channels)


def small_matmuls(s: CompileState) -> CompileState:
    """One-row matmuls become fused reductions on the Triton backend (gemv.py says why)."""
    return _fx_rewrite(s, s.options.gemv_as_reduction and isinstance(backend_for(s), TritonBackend), rewrite_gemv)


def pad_matmuls(s: CompileState) -> CompileState:
    """Large CUDA matmuls with a misaligned M, N or K run on zero-padded operands (padmm.py says why)."""
    return _fx_rewrite(s, s.options.pad_matmuls, pad_misaligned_matmuls)


def reinplace(s: CompileState) -> CompileState:
    """Inputs the graph mutates by index_put are updated in place (reinplace.py)."""
    if s.options.reinplace_mutations:
        reinplace_input_mutations(s.gm)
    return s


def lower(s: CompileState) -> CompileState:
    program, fallbacks = lower_graph(s.gm, s.example_inputs, s.options, s.name)
    s.texts["ir_pre_fusion"] = program.as_text()
    log("ir_pre_fusion").info("%s", s.texts["ir_pre_fusion"])
    return replace(s, program=program, fallbacks=fallbacks)


def remove_dead_code(s: CompileState) -> CompileState:
    assert s.program is not None
    return replace(s, program=eliminate_dead_code(s.program))


def split_long_reductions(s: CompileState) -> CompileState:
    """Triton: reductions of few outputs over many elements run in two passes (split_reductions.py)."""
    assert s.program is not None
    if not s.options.split_reductions or not isinstance(backend_for(s), TritonBackend):
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


def matmul_templates(s: CompileState) -> CompileState:
    """max-autotune: start the compile's tuning session (autotune/session.py) and choose for each static
    mm/addmm/bmm between cuBLAS and a Triton template with its pointwise consumer fused
    (mm_templates.py). The generated kernels' configurations are registered too, so every candidate of
    the program compiles in one parallel batch; they are timed in ``generate_kernels`` if they survive."""
    if not s.options.max_autotune or s.scheduled is None:
        return s
    backend = backend_for(s)
    if not isinstance(backend, TritonBackend):
        return s
    n = count_matmul_sites(s.scheduled) if s.options.autotune.matmul_templates else 0
    session = make_session(s.options.autotune, backend.device)
    if session is None:
        if n:
            log("perf_hints").info("max-autotune: no CUDA device here (cross-compiling or the interpreter): %d "
                                   "matmul(s) stay cuBLAS externs; compile on the target GPU to tune them "
                                   "(KILN_AUTOTUNE_CROSS_TARGET=cuda:90 measures what tuning would compile)", n)
        return s
    assert s.program is not None
    generated = [g for k in s.scheduled.kernels() for g in generate_triton_kernels(k, backend.cfg)]
    kernel_problems(generated, s.program.layouts(), backend.device, session, wanted=False)
    sched = select_templates(s.scheduled, s.options, backend.device, session) if n else s.scheduled
    if sched is not s.scheduled and enabled("ir_post_fusion"):
        log("ir_post_fusion").info("%s", sched.as_text())
    return replace(s, scheduled=sched, tuning=session)


def inplace_updates(s: CompileState) -> CompileState:
    """Mutated inputs, and intermediates dying in a pointwise kernel, written over by the kernel that
    computes their successor (scheduler/inplace.py). C++: its writer orders each loop point's stores
    after its loads; Triton: intermediates of kernels with one store only."""
    assert s.scheduled is not None
    if not isinstance(backend_for(s), CppBackend):
        sched = plan_inplace_reuse(s.scheduled, single_store=True)
    else:
        sched = s.scheduled
        if s.options.reinplace_mutations:
            sched = plan_inplace_updates(sched, annotations_of(s.gm).input_mutations)
        sched = plan_inplace_reuse(sched)
    return replace(s, scheduled=sched)


def group_independent_kernels(s: CompileState) -> CompileState:
    """C++: runs of independent pointwise kernels launched as one group, one parallel region over their
    flattened ranges (scheduler/horizontal.py)."""
    assert s.scheduled is not None
    sched = s.scheduled
    if isinstance(backend_for(s), CppBackend) and s.options.group_kernels and s.options.fuse:
        sched = group_kernels(sched)
    # the schedule is final here: its text is made once (a large program's text costs 0.1-0.3 s)
    s.texts["ir_post_fusion"] = sched.as_text()
    return replace(s, scheduled=sched)


def generate_kernels(s: CompileState) -> CompileState:
    assert s.scheduled is not None and s.program is not None
    backend = backend_for(s)
    if isinstance(backend, TritonBackend):  # with max-autotune's session (matmul_templates) when there is one
        kernels = backend.compile(s.scheduled, s.program.layouts(), s.options, tuning=s.tuning)
    else:
        kernels = backend.compile(s.scheduled, s.program.layouts(), s.options)
    return replace(s, kernels=kernels)


def generate_wrapper(s: CompileState) -> CompileState:
    assert s.scheduled is not None and s.kernels is not None
    s = _with_size_guards(s)
    assert s.scheduled is not None and s.kernels is not None
    src = wrapper_source(s.scheduled, s.kernels, arena=s.options.memory_arena)
    s.texts["output_code"] = src + ("\n# ---- kernels ----\n" + s.kernels.source_text if s.kernels.source_text else "")
    log("output_code").info("%s", s.texts["output_code"])
    return replace(s, wrapper=src)


def _with_size_guards(s: CompileState) -> CompileState:
    """The relations this compile assumed about symbolic sizes, on the program the wrapper checks."""
    if s.guards is None or s.program is None or s.scheduled is None:
        return s
    added = s.guards.added(s.name)
    if not added:
        return s
    program = replace(s.program, size_guards=tuple(dict.fromkeys((*s.program.size_guards, *added))))
    return replace(s, program=program, scheduled=replace(s.scheduled, program=program))


PASSES: list[Pass[CompileState]] = [
    Pass("propagate_meta", lambda s, ctx: propagate_meta(s)),
    Pass("decompose", lambda s, ctx: decompose(s)),
    Pass("patch_convs", lambda s, ctx: patch_convs(s)),
    Pass("conv_layout", lambda s, ctx: conv_layout(s)),
    Pass("pad_stems", lambda s, ctx: pad_stems(s)),
    Pass("small_matmuls", lambda s, ctx: small_matmuls(s)),
    Pass("pad_matmuls", lambda s, ctx: pad_matmuls(s)),
    Pass("reinplace", lambda s, ctx: reinplace(s)),
    Pass("lower", lambda s, ctx: lower(s)),
    Pass("remove_dead_code", lambda s, ctx: remove_dead_code(s)),
    Pass("split_reductions", lambda s, ctx: split_long_reductions(s)),
    Pass("fuse_and_plan", lambda s, ctx: fuse_and_plan(s)),
    Pass("matmul_templates", lambda s, ctx: matmul_templates(s)),
    Pass("inplace_updates", lambda s, ctx: inplace_updates(s)),
    Pass("group_kernels", lambda s, ctx: group_independent_kernels(s)),
    Pass("generate_kernels", lambda s, ctx: generate_kernels(s)),
    Pass("generate_wrapper", lambda s, ctx: generate_wrapper(s)),
]


def verify_state(s: CompileState) -> None:
    if s.scheduled is not None:
        verify_schedule(s.scheduled)
    elif s.program is not None:
        verify_program(s.program)


def now() -> float:
    return time.perf_counter()
