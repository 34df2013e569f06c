"""Per-stage compile time of kiln, measured from the outside by wrapping stage entry points.

``StageTimer.install()`` replaces each function named in ``STAGES`` -- in its own module and in every
``kiln.*`` module that imported it by name -- with a wrapper that charges the time spent inside it to
its stage. Time is *exclusive*: a stage nested in another (the C++ build inside code generation) is
taken out of the outer one, so the stages add up to the compile time they cover. Nothing inside kiln
changes; ``uninstall()`` restores the originals.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

# (module, function name, stage). Order of stages in reports follows ORDER.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("kiln.capture.capture", "run_capture", "capture"),
    ("kiln.graph.guards", "GuardSet.compile", "guards"),
    ("kiln.autograd.joint", "trace_joint", "autograd: trace"),
    ("kiln.autograd.joint", "trace_inference", "autograd: trace"),
    ("kiln.autograd.partition", "partition", "autograd: partition"),
    ("kiln.inductor.decomp_bridge", "decompose", "decomp"),
    ("kiln.inductor.decomp_bridge", "ensure_meta", "decomp"),
    ("kiln.inductor.passes", "conv_layout", "graph passes"),
    ("kiln.inductor.passes", "small_matmuls", "graph passes"),
    ("kiln.inductor.passes", "pad_matmuls", "graph passes"),
    ("kiln.inductor.passes", "reinplace", "graph passes"),
    ("kiln.inductor.passes", "lower", "lowering"),
    ("kiln.inductor.passes", "remove_dead_code", "scheduling"),
    ("kiln.inductor.passes", "fuse_and_plan", "scheduling"),
    ("kiln.inductor.passes", "matmul_templates", "scheduling"),
    ("kiln.inductor.passes", "inplace_updates_cpp", "scheduling"),
    ("kiln.inductor.passes", "inplace_updates_triton", "scheduling"),
    ("kiln.inductor.passes", "generate_cpp_kernels", "codegen"),
    ("kiln.inductor.passes", "generate_triton_kernels", "codegen"),
    ("kiln.inductor.passes", "generate_wrapper", "codegen"),
    # loading the wrapper module runs its _kiln_precompile: the Triton compile on a GPU
    ("kiln.inductor.compile", "load_wrapper", "wrapper load / Triton compile"),
    # waiting for the kernels compiling on kiln's compile workers (the first call, or a cross-compile's end)
    ("kiln.inductor.compile_pool", "CompileBatch.wait", "Triton compile (wait)"),
    ("kiln.inductor.codegen.cpp.build", "build_shared_library", "C++ compile"),
    ("kiln.runtime.graph_cache", "graph_key", "graph cache key/store"),
    ("kiln.runtime.graph_cache", "GraphCache.save", "graph cache key/store"),
)
ORDER = ("capture", "guards", "autograd: trace", "autograd: partition", "decomp", "graph passes",
         "lowering", "scheduling", "codegen", "C++ compile",
         "wrapper load / Triton compile", "Triton compile (wait)", "graph cache key/store")


def cpu_clock() -> float:
    """CPU seconds of this process and its waited-for children (g++): steadier than wall time on a
    shared machine, and it still counts a compiler subprocess."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class StageTimer:
    """Exclusive seconds per stage on ``clock`` (``time.perf_counter`` or ``cpu_clock``)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []  # per active span: [child seconds]
        self._restore: list[tuple[Any, str, Any]] = []
        self.missing: list[str] = []

    def _wrap(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([0.0])
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                total = self.clock() - t0
                child = self._stack.pop()[0]
                self.seconds[stage] += total - child
                if self._stack:
                    self._stack[-1][0] += total
        timed.__kiln_bench_original__ = fn  # type: ignore[attr-defined]
        return timed

    def install(self) -> StageTimer:
        for module_name, attr, stage in STAGES:
            try:
                module = importlib.import_module(module_name)
                owner: Any = module
                for part in attr.split(".")[:-1]:  # "Class.method"
                    owner = getattr(owner, part)
                original = getattr(owner, attr.split(".")[-1])
            except (ImportError, AttributeError):
                self.missing.append(f"{module_name}.{attr}")
                continue
            wrapped = self._wrap(original, stage)
            if owner is not module:
                setattr(owner, attr.split(".")[-1], wrapped)
                self._restore.append((owner, attr.split(".")[-1], original))
                continue
            for mod in [m for name, m in list(sys.modules.items()) if name.startswith("kiln")]:
                for name, value in list(vars(mod).items()):
                    if value is original:
                        setattr(mod, name, wrapped)
                        self._restore.append((mod, name, original))
        return self

    def uninstall(self) -> None:
        for mod, name, original in reversed(self._restore):
            setattr(mod, name, original)
        self._restore.clear()

    def report(self, total: float) -> dict[str, float]:
        """Seconds per stage; ``other`` is the rest of ``total`` (first run, guards, glue)."""
        out = {stage: round(self.seconds.get(stage, 0.0), 3) for stage in ORDER}
        out["other"] = round(total - sum(self.seconds.values()), 3)
        return out
