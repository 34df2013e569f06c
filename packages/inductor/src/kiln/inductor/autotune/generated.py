"""max-autotune for the Triton kernels a compile generated: each tunable kernel becomes a problem of
the compile's ``TuningSession`` (compiled in one parallel batch, then timed), and the fastest
configuration is applied to it.

Code generation calls this through the ``KernelTuner`` it is handed (``GeneratedKernelTuner``), so
codegen imports nothing of autotune: autotune builds on codegen's kernels, not the other way round.
"""

from __future__ import annotations

import torch

from kiln.graph import log

from ..codegen.triton.kernel import TritonKernel
from ..codegen.triton.wrapper import load_triton_module, module_source
from ..ir import Layout
from .entry import session_for_tuner
from .kernels import apply_config, buffers_for, kernel_problem
from .session import Problem, TuningSession
from .tuner import Autotuner

TUNABLE_KINDS = ("pointwise", "persistent_reduction", "looped_reduction")


def kernel_problems(generated: list[TritonKernel], layouts: dict[str, Layout], device: str,
                    session: TuningSession, wanted: bool) -> list[tuple[int, Problem]]:
    """Register the tunable kernels of ``generated`` with a max-autotune ``TuningSession``: (index,
    problem) pairs. Kernels sharing normalised source, sizes and dtypes share one problem (one tuning);
    2-D tiled kernels and kernels with symbolic sizes keep the heuristic configuration (logged)."""
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
    session = session if session is not None else session_for_tuner(tuner, device)
    problems = kernel_problems(generated, layouts, device, session, wanted=True)
    session.run()
    out = list(generated)
    for i, p in problems:
        out[i] = apply_config(generated[i], session.choice(p).config)
    return out


class GeneratedKernelTuner:
    """The ``KernelTuner`` (codegen/triton/backend.py) over one compile's ``TuningSession``."""

    __slots__ = ("session",)

    def __init__(self, session: TuningSession) -> None:
        self.session = session

    def tune(self, generated: list[TritonKernel], layouts: dict[str, Layout], device: str) -> list[TritonKernel]:
        return autotune_kernels(generated, layouts, device, session=self.session)

    def finish(self) -> None:
        self.session.finish()
