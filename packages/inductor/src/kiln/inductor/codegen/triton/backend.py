"""The Triton kernel backend behind the shared wrapper (``KernelBackend`` of codegen/common.py).

Kernel sources are embedded as text in the wrapper's prelude; nothing is compiled here, so CUDA
graphs compile on a machine without a GPU (cross-compilation with fake tensors) and triton compiles
each kernel on its first launch. On CPU tensors the same kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``; ``InductorOptions(cpu_backend="triton")``), which is how CI tests this path.
"""

from __future__ import annotations

import os
import time

import torch

from kiln.graph import log

from ...autotune.mm_template import TemplateKernel
from ...ir import Layout, ScheduledProgram
from ...options import InductorOptions
from ..common import CompiledKernels
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


def autotune_kernels(generated: list[TritonKernel], layouts: dict[str, Layout], device: str,
                     tuner: object | None = None) -> list[TritonKernel]:
    """max-autotune: benchmark each generated kernel's launch configurations on scratch buffers shaped
    like its arguments and keep the fastest (autotune/kernels.py; results cached on disk, so a
    second process does not re-tune). 2-D tiled kernels and kernels with symbolic sizes keep the
    heuristic configuration (logged)."""
    from ...autotune import buffers_for, make_tuner, tune_kernel

    module = load_triton_module(module_source(generated))  # type: ignore[operator]
    tuner = tuner or make_tuner()
    out = []
    for k in generated:
        if k.kind == "mm_template":  # tuned when it was chosen
            out.append(k)
            continue
        if k.kind not in TUNABLE_KINDS or k.size_args:
            log("perf_hints").info("max-autotune: %s (%s) keeps its heuristic configuration", k.name, k.kind)
            out.append(k)
            continue
        buffers = buffers_for({b: layouts[b] for b in k.pointer_args}, None, device)
        tuned, _ = tune_kernel(k, getattr(module, k.name), [buffers[b] for b in k.pointer_args],
                               tuner=tuner)  # type: ignore[arg-type]
        out.append(tuned)  # type: ignore[arg-type]
    return out


class TritonBackendError(RuntimeError):
    pass


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class TritonBackend:
    name = "triton"

    def __init__(self, device: str = "cuda", cfg: TritonConfig = DEFAULT_CONFIG) -> None:
        self.device = device
        self.cfg = cfg

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions) -> CompiledKernels:
        if self.device == "cpu" and not interpreter_enabled():
            raise TritonBackendError(
                "cpu_backend='triton' runs Triton kernels on CPU tensors through the Triton interpreter: set "
                "TRITON_INTERPRET=1 in the environment (before the first compile), or use cpu_backend='cpp'")
        t0 = time.perf_counter()
        kernels = scheduled.kernels()
        generated = []
        launches: dict[str, str] = {}
        for k in kernels:
            # a matmul template chosen by max-autotune (mm_templates.py) brings its own kernel
            parts = [k.triton_kernel()] if isinstance(k, TemplateKernel) else generate_kernels(k, self.cfg)
            generated += parts
            # one line (the wrapper indents it); an empty iteration space launches nothing
            launches[k.name] = "; ".join(_launch_line(g) for g in parts)
        if options.max_autotune and generated:
            if self.device == "cuda" and torch.cuda.is_available():
                from ...autotune import make_tuner

                generated = autotune_kernels(generated, layouts, "cuda", make_tuner(options.autotune))
            else:
                log("perf_hints").info("max-autotune: no CUDA device here (cross-compiling or the "
                                       "interpreter): kernels keep their heuristic configurations")
        source = module_source(generated) if generated else ""
        inputs = frozenset(b.name for b in scheduled.program.inputs)
        return CompiledKernels(files={}, prelude=wrapper_prologue(generated, inputs=inputs, dtypes={
                                   b: layouts[b].dtype for g in generated for b in g.pointer_args if b in layouts}), launches=launches,
                               source_text=source, local_dir="", compile_seconds=time.perf_counter() - t0,
                               requires=("torch", "triton"), device=self.device,
                               call_prologue=f"{CTX_VAR} = _kiln_launch_context()" if generated else "")
