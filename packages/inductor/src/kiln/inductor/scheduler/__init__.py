"""The scheduler, split by concern: dependencies (+ dead code), fusion, kernel building, memory."""

from __future__ import annotations

from ..ir import ExternKernel, Kernel, LoopProgram, ScheduledProgram
from ..options import InductorOptions
from .dependencies import analyze, eliminate_dead_code
from .fusion import group_nodes
from .kernels import build_kernel
from .memory import PlannedPeak, plan_memory, planned_peak


def schedule(p: LoopProgram, options: InductorOptions) -> ScheduledProgram:
    deps = analyze(p)
    groups = group_nodes(p, deps, options)
    works: list[Kernel | ExternKernel] = []
    for g in groups:
        node = p.nodes[g.members[0]]
        if isinstance(node, ExternKernel):
            works.append(node)
        else:
            works.append(build_kernel(g, p, deps, len(works)))
    return ScheduledProgram(p, tuple(plan_memory(p, works)))


__all__ = ["PlannedPeak", "analyze", "eliminate_dead_code", "group_nodes", "planned_peak", "schedule"]
