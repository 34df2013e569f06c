"""The Triton kernel backend behind the shared wrapper (``KernelBackend`` of codegen/common.py).

Kernel sources are embedded as text in the wrapper's prelude; nothing is compiled here, so CUDA
graphs compile on a machine without a GPU (cross-compilation with fake tensors) and triton compiles
each kernel on its first launch. On CPU tensors the same kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``; ``InductorOptions(cpu_backend="triton")``), which is how CI tests this path.
"""

from __future__ import annotations

import os
import time

from ...ir import Layout, ScheduledProgram
from ...options import InductorOptions
from ..common import CompiledKernels
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .kernel import TritonKernel, generate_kernels
from .wrapper import MODULE_VAR, module_source, wrapper_prologue

CTX_VAR = "_kctx"  # (device, stream), read once per wrapper call


def _launch_line(g: TritonKernel) -> str:
    launch = g.launch_code(MODULE_VAR, ctx=CTX_VAR)
    if g.xnumel == "0" or g.ynumel == "0":
        return "pass"
    return f"({launch}) if {g.xnumel} > 0 else None" if g.size_args else launch


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
            parts = generate_kernels(k, self.cfg)
            generated += parts
            # one line (the wrapper indents it); an empty iteration space launches nothing
            launches[k.name] = "; ".join(_launch_line(g) for g in parts)
        source = module_source(generated) if generated else ""
        inputs = frozenset(b.name for b in scheduled.program.inputs)
        return CompiledKernels(files={}, prelude=wrapper_prologue(generated, inputs=inputs), launches=launches,
                               source_text=source, local_dir="", compile_seconds=time.perf_counter() - t0,
                               requires=("torch", "triton"), device=self.device,
                               call_prologue=f"{CTX_VAR} = _kiln_launch_context()" if generated else "")
