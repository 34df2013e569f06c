"""kiln.inductor's pipeline, top to bottom: one stage list per kernel backend, walked by compile.py.

The backend is chosen once, when a compile starts (``choose_backend``), and picks the list; no pass
asks again which backend it runs for. Each pass maps the frozen ``CompileState`` to the next
(passes.py). Under ``KILN_VERIFY=1`` (or ``InductorOptions.verify``) the state is verified after
every pass: the graph before lowering (graph_passes/verify.py), the loop program and the schedule
after it (ir/verify.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import fx

from kiln.graph import Pass

from .codegen.cpp import CppBackend
from .codegen.triton.backend import TritonBackend
from .decomp_bridge import stale_devices
from .graph_passes.verify import verify_graph
from .ir import verify_program, verify_schedule
from .options import InductorOptions
from .passes import (
    CompileState,
    common_subexpressions,
    conv_bias,
    conv_layout,
    decode_attention,
    decompose,
    fuse_and_plan,
    generate_cpp_kernels,
    generate_triton_kernels,
    generate_wrapper,
    group_independent_kernels,
    group_triton_kernels,
    index_width,
    inplace_updates_cpp,
    inplace_updates_triton,
    lower,
    matmul_templates,
    misaligned_matmuls,
    pad_matmuls,
    pad_stems,
    patch_convs,
    propagate_meta,
    recompute_scalars,
    reinplace,
    remove_dead_code,
    small_matmuls,
    split_long_reductions,
)

# C++/OpenMP kernels for CPU tensors.
CPP_STAGES: tuple[Pass[CompileState], ...] = (
    # graph passes (torch.fx)
    Pass("propagate_meta", lambda s, _: propagate_meta(s), "fake-tensor meta['val'] for hand-built graphs"),
    Pass("decompose", lambda s, _: decompose(s), "kiln.decomp's inductor table, minus what inductor lowers"),
    Pass("cse", lambda s, _: common_subexpressions(s), "equal pure calls on equal arguments computed once"),
    Pass("conv_layout", lambda s, _: conv_layout(s), "channels-last convolutions when options.conv_layout says"),
    Pass("reinplace", lambda s, _: reinplace(s), "mutated inputs' index_put written in place"),
    # loop IR
    Pass("lower", lambda s, _: lower(s), "graph -> LoopProgram (ir_pre_fusion)"),
    Pass("remove_dead_code", lambda s, _: remove_dead_code(s), "drop nodes no output needs"),
    Pass("fuse_and_plan", lambda s, _: fuse_and_plan(s), "fusion, loop order, memory plan -> ScheduledProgram"),
    Pass("inplace_updates", lambda s, _: inplace_updates_cpp(s), "mutated inputs and dying buffers written over"),
    Pass("group_kernels", lambda s, _: group_independent_kernels(s),
         "runs of independent pointwise kernels as one launch, one parallel region"),
    # code
    Pass("generate_kernels", lambda s, _: generate_cpp_kernels(s), "one shared library, cached by source hash"),
    Pass("generate_wrapper", lambda s, _: generate_wrapper(s), "the Python module that runs the schedule"),
)

# Triton kernels: CUDA tensors, or CPU tensors under the Triton interpreter (cpu_backend="triton").
# patch_convs, pad_stems, conv_bias, pad_matmuls and misaligned_matmuls rewrite CUDA nodes only (cuDNN
# workspaces and bias kernels, cuBLAS alignment).
TRITON_STAGES: tuple[Pass[CompileState], ...] = (
    # graph passes (torch.fx)
    Pass("propagate_meta", lambda s, _: propagate_meta(s), "fake-tensor meta['val'] for hand-built graphs"),
    Pass("decompose", lambda s, _: decompose(s), "kiln.decomp's inductor table, minus what inductor lowers"),
    Pass("cse", lambda s, _: common_subexpressions(s), "equal pure calls on equal arguments computed once"),
    Pass("patch_convs", lambda s, _: patch_convs(s), "CUDA patch-embedding stems as matmuls over the patches"),
    Pass("conv_layout", lambda s, _: conv_layout(s), "channels-last convolutions when options.conv_layout says"),
    Pass("pad_stems", lambda s, _: pad_stems(s), "CUDA half-precision 3-channel stems padded to 8 channels"),
    Pass("conv_bias", lambda s, _: conv_bias(s), "CUDA convolution biases added in their consumers' kernels"),
    Pass("small_matmuls", lambda s, _: small_matmuls(s), "one-row matmuls as fused reductions"),
    Pass("pad_matmuls", lambda s, _: pad_matmuls(s), "misaligned CUDA matmuls on zero-padded operands"),
    Pass("reinplace", lambda s, _: reinplace(s), "mutated inputs' index_put written in place"),
    # loop IR
    Pass("lower", lambda s, _: lower(s), "graph -> LoopProgram (ir_pre_fusion)"),
    Pass("index_width", lambda s, _: index_width(s), "symbolic sizes guarded into a 32-bit index range"),
    Pass("recompute_scalars", lambda s, _: recompute_scalars(s),
         "a scalar reduction (RMSNorm's statistic) computed again in the reductions over its range that read it"),
    Pass("remove_dead_code", lambda s, _: remove_dead_code(s), "drop nodes no output needs"),
    Pass("split_reductions", lambda s, _: split_long_reductions(s), "few-output long reductions in two passes"),
    Pass("fuse_and_plan", lambda s, _: fuse_and_plan(s), "fusion, loop order, memory plan -> ScheduledProgram"),
    Pass("decode_attention", lambda s, _: decode_attention(s), "one-query attention as kiln's Triton kernel"),
    Pass("misaligned_matmuls", lambda s, _: misaligned_matmuls(s),
         "large matmuls with misaligned result rows as Triton templates (untuned)"),
    Pass("matmul_templates", lambda s, _: matmul_templates(s), "max-autotune: Triton matmul templates vs cuBLAS"),
    Pass("inplace_updates", lambda s, _: inplace_updates_triton(s),
         "mutated inputs their kernel alone reads, and dying buffers of one-store kernels, written over"),
    Pass("group_kernels", lambda s, _: group_triton_kernels(s),
         "runs of independent flat kernels as one launch, its programs split between them"),
    # code
    Pass("generate_kernels", lambda s, _: generate_triton_kernels(s), "one Triton module, compiled in workers"),
    Pass("generate_wrapper", lambda s, _: generate_wrapper(s), "the Python module that runs the schedule"),
)


def _graph_tensors(gm: fx.GraphModule | None) -> Iterator[torch.Tensor]:
    for node in gm.graph.nodes if gm is not None else ():
        val = node.meta.get("val")
        yield from (v for v in (val if isinstance(val, (list, tuple)) else (val,)) if isinstance(v, torch.Tensor))


def choose_backend(example_inputs: Sequence[object], options: InductorOptions,
                   gm: fx.GraphModule | None = None) -> CppBackend | TritonBackend:
    """Triton for a graph that computes on CUDA tensors (real or fake: sources are generated, not run),
    else the CPU choice. The graph's values count, not only its inputs: CPU inputs moved to the GPU
    inside the graph (``x.cuda()``, NumPy under ``torch.device("cuda")``) compute there; the graph's
    CPU-side nodes then run through ATen (lowering/lower.py)."""
    in_graph = _graph_tensors(gm) if gm is not None and not stale_devices(gm, example_inputs) else iter(())
    tensors = [*(x for x in example_inputs if isinstance(x, torch.Tensor)), *in_graph]
    if any(t.device.type == "cuda" for t in tensors):
        return TritonBackend("cuda")
    if options.cpu_backend == "triton":
        return TritonBackend("cpu")
    if options.cpu_backend != "cpp":
        raise ValueError(f"InductorOptions.cpu_backend={options.cpu_backend!r}: use 'cpp' or 'triton'")
    return CppBackend()


def stages_for(backend: CppBackend | TritonBackend) -> tuple[Pass[CompileState], ...]:
    return TRITON_STAGES if isinstance(backend, TritonBackend) else CPP_STAGES


def verify_state(s: CompileState) -> None:
    """The verifier of the IR level the state is at (run after every pass under KILN_VERIFY=1)."""
    if s.scheduled is not None:
        verify_schedule(s.scheduled)
    elif s.program is not None:
        verify_program(s.program)
    else:
        verify_graph(s.gm)
