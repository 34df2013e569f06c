"""The Triton kernel backend behind the shared wrapper (``KernelBackend`` of codegen/common.py).

Kernel sources are embedded as text in the wrapper's prelude. On a GPU (or with
``KILN_TRITON_CROSS_TARGET``) the final kernels are handed to the compile worker processes here
(ahead.py, compile_pool.py) and the compiled graph waits for them on its first call; otherwise triton
compiles each kernel on its first launch (or the wrapper's precompile does, on a thread pool). CUDA
graphs compile on a machine without a GPU (cross-compilation with fake tensors). On CPU tensors the same kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``; ``InductorOptions(cpu_backend="triton")``), which is how CI tests this path.
"""

from __future__ import annotations

import time

import torch

from kiln.graph import log
from kiln.runtime import triton_module_name

from ...autotune.mm_template import TemplateKernel
from ...autotune.session import Problem, TuningSession
from ...autotune.tuner import Autotuner
from ...compile_pool import PROCESS_POOL, TritonCompilePool
from ...ir import Layout, ScheduledProgram
from ...knobs import triton_interpret
from ...options import InductorOptions
from ..common import CompiledKernels
from .ahead import compile_ahead
from .dedup import share_identical_kernels
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .kernel import TritonKernel, generate_kernels
from .wrapper import MODULE_VAR, load_triton_module, module_source, wrapper_prologue

CTX_VAR = "_kctx"  # (device, stream), read once per wrapper call


def _launch_line(g: TritonKernel) -> str:
    launch = g.launch_code(MODULE_VAR, ctx=CTX_VAR)
    if g.xnumel == "0" or g.ynumel == "0":
        return "pass"
    return f"({launch}) if {g.xnumel} > 0 else None" if g.size_args else launch


TUNABLE_KINDS = ("pointwise", "persistent_reduction", "looped_reduction")


def kernel_problems(generated: list[TritonKernel], layouts: dict[str, Layout], device: str,
                    session: TuningSession, wanted: bool) -> list[tuple[int, Problem]]:
    """Register the tunable kernels of ``generated`` with a max-autotune ``TuningSession``: (index,
    problem) pairs. Kernels sharing normalised source, sizes and dtypes share one problem (one tuning);
    2-D tiled kernels and kernels with symbolic sizes keep the heuristic configuration (logged)."""
    from ...autotune import kernel_problem

    assert isinstance(session, TuningSession)
    module: list[object] = []

    def fn_of(name: str):
        def get() -> object:
            if not module:  # loaded once, only when some problem is compiled or timed
                module.append(load_triton_module(module_source(generated)))
            return getattr(module[0], name)
        return get

    dev_name = _device_name(device)
    limit = session.options.kernel_configs
    out = []
    for i, k in enumerate(generated):
        if k.kind not in TUNABLE_KINDS or k.size_args:
            if wanted and k.kind != "mm_template":  # a template was tuned when it was chosen
                log("perf_hints").info("max-autotune: %s (%s) keeps its heuristic configuration", k.name, k.kind)
            continue
        p = kernel_problem(k, fn_of(k.name), [layouts[b].dtype for b in k.pointer_args],
                           _LazyBuffers(k.pointer_args, layouts, device), dev_name, limit)
        out.append((i, session.add(p, wanted=wanted)))
    return out


class _LazyBuffers:
    """Scratch buffers for one kernel's arguments, made on first use (a cached choice needs none)."""

    def __init__(self, names: tuple[str, ...], layouts: dict[str, Layout], device: str) -> None:
        self.names, self.layouts, self.device = names, layouts, device
        self.made: list[torch.Tensor] | None = None

    def __call__(self) -> list[torch.Tensor]:
        if self.made is None:
            from ...autotune import buffers_for

            bufs = buffers_for({b: self.layouts[b] for b in self.names}, None, self.device)
            self.made = [bufs[b] for b in self.names]
        return self.made


def _device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{device} (Triton interpreter)" if device == "cpu" else device


def autotune_kernels(generated: list[TritonKernel], layouts: dict[str, Layout], device: str,
                     tuner: Autotuner | None = None, session: TuningSession | None = None) -> list[TritonKernel]:
    """max-autotune: each generated kernel's launch configurations, compiled together and then timed
    on scratch buffers shaped like its arguments; the fastest is kept (by the margin rule). With a
    ``session`` (the compile's TuningSession, which may already have compiled and timed kernels of
    the schedule before the matmul templates were chosen) its budget and dedup apply."""
    from ...autotune import apply_config
    from ...autotune.entry import session_for_tuner

    session = session if session is not None else session_for_tuner(tuner, device)
    problems = kernel_problems(generated, layouts, device, session, wanted=True)
    session.run()
    out = list(generated)
    for i, p in problems:
        out[i] = apply_config(generated[i], session.choice(p).config)
    return out


class TritonBackendError(RuntimeError):
    pass


def interpreter_enabled() -> bool:
    return triton_interpret()


class TritonBackend:
    name = "triton"

    def __init__(self, device: str = "cuda", cfg: TritonConfig = DEFAULT_CONFIG,
                 pool: TritonCompilePool = PROCESS_POOL) -> None:
        self.device = device
        self.cfg = cfg
        self.pool = pool  # the Triton compile pool its kernels compile on (compile_pool.py)

    def generate(self, scheduled: ScheduledProgram, layouts: dict[str, Layout], options: InductorOptions,
                 tuning: TuningSession | None = None) -> tuple[list[TritonKernel], list[tuple[str, int, int]]]:
        """The final Triton kernels of ``scheduled`` (tuned with max-autotune's session when there is one,
        identical ones sharing a function), and each scheduled kernel's span of them ``(name, start, end)``."""
        if self.device == "cpu" and not interpreter_enabled():
            raise TritonBackendError(
                "cpu_backend='triton' runs Triton kernels on CPU tensors through the Triton interpreter: set "
                "TRITON_INTERPRET=1 in the environment (before the first compile), or use cpu_backend='cpp'")
        kernels = scheduled.kernels()
        hints = getattr(scheduled.program, "hints", None)  # symbolic sizes' example values (block sizes)
        generated: list[TritonKernel] = []
        spans: list[tuple[str, int, int]] = []  # (scheduled kernel, its generated kernels' [start, end))
        for k in kernels:
            # a matmul template chosen by max-autotune (mm_templates.py) brings its own kernel
            parts = [k.triton_kernel()] if isinstance(k, TemplateKernel) else generate_kernels(k, self.cfg, hints)
            spans.append((k.name, len(generated), len(generated) + len(parts)))
            generated += parts
        if tuning is not None:  # the compile's max-autotune session (pipeline.py: matmul_templates)
            if generated:
                generated = autotune_kernels(generated, layouts, self.device, session=tuning)
            tuning.finish()
        elif options.max_autotune and generated:
            log("perf_hints").info("max-autotune: no CUDA device here (cross-compiling or the "
                                   "interpreter): kernels keep their heuristic configurations")
        # launch lines only after this: a tuned XBLOCK changes the grid (it was written from the heuristic
        # config before, so a tuned kernel ran on too few or too many programs: wrong results).
        generated, shared = share_identical_kernels(generated)
        if shared:
            log("perf_hints").info("triton: %d of %d kernels launch an identical kernel's function (compiled once)",
                                   shared, len(generated))
        return generated, spans

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions, tuning: TuningSession | None = None) -> CompiledKernels:
        t0 = time.perf_counter()
        generated, spans = self.generate(scheduled, layouts, options, tuning)
        # One launch line each (the wrapper indents it); an empty iteration space launches nothing.
        # the final kernels start compiling now, in worker processes, while the compile goes on
        pending = compile_ahead(generated, layouts, self.device, pool=self.pool) if generated else None
        launches = {name: "; ".join(_launch_line(g) for g in generated[a:b]) for name, a, b in spans}
        source = module_source(generated) if generated else ""
        inputs = frozenset(b.name for b in scheduled.program.inputs)
        return CompiledKernels(files={}, prelude=wrapper_prologue(generated, inputs=inputs, dtypes={
                                   b: layouts[b].dtype for g in generated for b in g.pointer_args if b in layouts}), launches=launches,
                               source_text=source, local_dir="", compile_seconds=time.perf_counter() - t0,
                               requires=("torch", "triton"), device=self.device,
                               call_prologue=f"{CTX_VAR} = _kiln_launch_context()" if generated else "",
                               pending=pending, triton_modules=(triton_module_name(source),) if generated else ())
