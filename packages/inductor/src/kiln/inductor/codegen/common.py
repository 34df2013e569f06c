"""The interface between the scheduler and code generator backends.

A backend turns the kernels of a ScheduledProgram into ``CompiledKernels``: files the wrapper needs
at run time, Python source defining launchers (it may read ``FILES_DIR``), and for each kernel a
Python launch statement over buffer names. The wrapper generator (codegen/wrapper.py) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..ir import Layout, ScheduledProgram, TensorRef, work_buffers
from ..options import InductorOptions


@dataclass(frozen=True)
class CompiledKernels:
    files: Mapping[str, bytes]  # name -> content, shipped in the PortableProgram
    prelude: str  # Python source run once when the wrapper module loads (loads libraries, defines launchers)
    launches: Mapping[str, str]  # kernel name -> Python statement launching it
    source_text: str  # kernel sources for the output_code log
    local_dir: str  # where ``files`` already are on this machine (FILES_DIR for in-process use)
    compile_seconds: float = 0.0
    requires: tuple[str, ...] = field(default=("torch",))
    device: str = "cpu"  # where the wrapper allocates buffers and the seed ("cuda" for Triton on GPUs)
    call_prologue: str = ""  # one statement at the start of ``call`` (Triton: read device and stream once)
    triton_modules: tuple[str, ...] = ()  # Triton: the kernel module the wrapper imports (PortableProgram's)
    # Triton: the kernels compiling ahead in worker processes (compile_pool.CompileBatch);
    # the compiled graph waits for them on its first call
    pending: Pending | None = None


class Pending(Protocol):
    """Work still running in the background (compile_pool.CompileBatch)."""

    def wait(self) -> object: ...


class KernelBackend(Protocol):
    name: str

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions) -> CompiledKernels: ...


def input_last_uses(s: ScheduledProgram, reused: set[str]) -> dict[int, list[str]]:
    """Step index -> graph inputs last read there (-1: never read), which a wrapper may drop after that
    step. Only ``call_owned`` callers gain from it: they handed over their references (a backward's saved
    activations die as it goes, as in eager's autograd engine). Outputs and ``reused`` buffers (updated in
    place) stay bound."""
    p = s.program
    kept = {o.buffer for o in p.outputs if isinstance(o, TensorRef)} | reused
    last: dict[str, int] = {b.name: -1 for b in p.inputs if b.name not in kept}
    for k, st in enumerate(s.steps):
        for b in work_buffers(st.work):
            if b in last:
                last[b] = k
    by_step: dict[int, list[str]] = {}
    for b, k in last.items():
        by_step.setdefault(k, []).append(b)
    return by_step
