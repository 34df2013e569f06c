"""The Triton kernel backend behind the shared wrapper (``KernelBackend`` of codegen/common.py).

Kernel sources are embedded as text in the wrapper's prelude. On a GPU (or with
``KILN_TRITON_CROSS_TARGET``) the final kernels are handed to the compile worker processes here
(ahead.py, compile_pool.py) and the compiled graph waits for them on its first call; otherwise triton
compiles each kernel on its first launch (or the wrapper's precompile does, on a thread pool). CUDA
graphs compile on a machine without a GPU (cross-compilation with fake tensors). On CPU tensors the same kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``; ``InductorOptions(cpu_backend="triton")``), which is how CI tests this path.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol, runtime_checkable

from kiln.graph import log
from kiln.runtime import triton_module_name

from ...compile_pool import PROCESS_POOL, TritonCompilePool
from ...ir import Kernel, KernelGroup, Layout, ScheduledProgram
from ...knobs import triton_interpret
from ...options import InductorOptions
from ..common import CompiledKernels
from .ahead import compile_ahead
from .dedup import share_identical_kernels
from .group import generate_group
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .kernel import TritonKernel, generate_kernels
from .memo import KernelMemo
from .pdl import pdl_supported, with_pdl
from .prefetch import read_only_streams
from .wrapper import MODULE_VAR, module_source, wrapper_prologue

CTX_VAR = "_kctx"  # (device, stream), read once per wrapper call


def _launch_line(g: TritonKernel) -> str:
    launch = g.launch_code(MODULE_VAR, ctx=CTX_VAR)
    if g.xnumel == "0" or g.ynumel == "0":
        return "pass"
    return f"({launch}) if {g.xnumel} > 0 else None" if g.size_args else launch


class KernelTuner(Protocol):
    """max-autotune for generated kernels: the launch configuration of each chosen by timing it.
    ``kiln.inductor.autotune`` implements it (``GeneratedKernelTuner``); the compile hands it in, so
    code generation imports nothing of autotune."""

    def tune(self, generated: list[TritonKernel], layouts: dict[str, Layout],
             device: str) -> list[TritonKernel]: ...

    def finish(self) -> None: ...


@runtime_checkable
class PrebuiltKernel(Protocol):
    """A scheduled kernel that brings its own Triton kernels (max-autotune's matmul templates, decode
    attention), launched one after the other."""

    def triton_kernels(self) -> list[TritonKernel]: ...


class TritonBackendError(RuntimeError):
    pass


def interpreter_enabled() -> bool:
    return triton_interpret()


def _unwritten_inputs(scheduled: ScheduledProgram, kernels: list[Any]) -> frozenset[str]:
    """The graph's inputs no generated kernel writes (its weights, in a forward). An extern call writing one
    in place is not looked for: a prefetch is a hint that cannot change a result (prefetch.py), and this
    set only picks which reads are worth one."""
    written = {b for k in kernels if isinstance(k, (Kernel, KernelGroup)) for b in k.outputs}
    return frozenset(b.name for b in scheduled.program.inputs) - written


class TritonBackend:
    name = "triton"

    def __init__(self, device: str = "cuda", cfg: TritonConfig = DEFAULT_CONFIG,
                 pool: TritonCompilePool = PROCESS_POOL) -> None:
        self.device = device
        self.cfg = cfg
        self.pool = pool  # the Triton compile pool its kernels compile on (compile_pool.py)

    def generate(self, scheduled: ScheduledProgram, layouts: dict[str, Layout], options: InductorOptions,
                 tuner: KernelTuner | None = None) -> tuple[list[TritonKernel], list[tuple[str, int, int]]]:
        """The final Triton kernels of ``scheduled`` (tuned by max-autotune's tuner when there is one,
        identical ones sharing a function), and each scheduled kernel's span of them ``(name, start, end)``."""
        if self.device == "cpu" and not interpreter_enabled():
            raise TritonBackendError(
                "cpu_backend='triton' runs Triton kernels on CPU tensors through the Triton interpreter: set "
                "TRITON_INTERPRET=1 in the environment (before the first compile), or use cpu_backend='cpp'")
        kernels = scheduled.launched()  # a kernel group is one launch (group.py)
        hints = getattr(scheduled.program, "hints", None)  # symbolic sizes' example values (block sizes)
        index32 = getattr(scheduled.program, "index_bits", 64) == 32
        generated: list[TritonKernel] = []
        spans: list[tuple[str, int, int]] = []  # (scheduled kernel, its generated kernels' [start, end))
        memo = KernelMemo()  # identical layers' kernels generated once (memo.py)
        for k in kernels:
            # a matmul template chosen by max-autotune (matmul_templates.py) brings its own kernel
            if isinstance(k, KernelGroup):
                parts = generate_group(k, self.cfg, hints, index32)
            elif isinstance(k, PrebuiltKernel):
                parts = k.triton_kernels()
            else:
                parts = memo.generate(k, lambda k: generate_kernels(k, self.cfg, hints, index32))
            spans.append((k.name, len(generated), len(generated) + len(parts)))
            generated += parts
        if tuner is not None:  # the compile's max-autotune session (pipeline.py: matmul_templates)
            if generated:
                generated = tuner.tune(generated, layouts, self.device)
            tuner.finish()
        elif options.max_autotune and generated:
            log("perf_hints").info("max-autotune: no CUDA device here (cross-compiling or the "
                                   "interpreter): kernels keep their heuristic configurations")
        # weights a kernel's programs fetch into L2 before they wait for the kernel before (prefetch.py)
        read_only = _unwritten_inputs(scheduled, kernels) if options.pdl_prefetch else frozenset()
        generated = [dataclasses.replace(g, streams=read_only_streams(g.streams, read_only)) if g.streams else g
                     for g in generated]
        # launch lines only after this: a tuned XBLOCK changes the grid (it was written from the heuristic
        # config before, so a tuned kernel ran on too few or too many programs: wrong results).
        if options.pdl and pdl_supported(self.device):
            generated = [with_pdl(g) for g in generated]
        generated, shared = share_identical_kernels(generated)
        if shared:
            log("perf_hints").info("triton: %d of %d kernels launch an identical kernel's function (compiled once)",
                                   shared, len(generated))
        return generated, spans

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions, tuner: KernelTuner | None = None) -> CompiledKernels:
        t0 = time.perf_counter()
        generated, spans = self.generate(scheduled, layouts, options, tuner)
        # One launch line each (the wrapper indents it); an empty iteration space launches nothing.
        # the final kernels start compiling now, in worker processes, while the compile goes on
        pending = compile_ahead(generated, layouts, self.device, pool=self.pool) if generated else None
        launches = {name: "; ".join(_launch_line(g) for g in generated[a:b]) for name, a, b in spans}
        source = module_source(generated) if generated else ""
        inputs = frozenset(b.name for b in scheduled.program.inputs)
        # the graph inputs the kernels take: their alignment is read once per call (launcher.py)
        taken = sorted({b for g in generated for b in g.pointer_args if b in inputs})
        return CompiledKernels(files={}, prelude=wrapper_prologue(generated, inputs=inputs, dtypes={
                                   b: layouts[b].dtype for g in generated for b in g.pointer_args if b in layouts}), launches=launches,
                               source_text=source, local_dir="", compile_seconds=time.perf_counter() - t0,
                               requires=("torch", "triton"), device=self.device,
                               call_prologue=f"{CTX_VAR} = _kiln_launch_context({', '.join(taken)})" if generated else "",
                               pending=pending, triton_modules=(triton_module_name(source),) if generated else ())
