"""Compile every autotuning candidate of a compile together, before any is timed.

Triton compiles a kernel in 0.1-1 s (a matmul template with 3-5 pipeline stages is the slow end);
compiled one after another at first launch, a GPT-2's few hundred candidates took minutes. Like
torch.compile's max-autotune, kiln compiles them all first, in parallel, then times them serially.

A ``CompileJob`` is one (kernel function, argument dtypes, constexprs, warps, stages): exactly what
the timed launch will specialise on, so the launch finds the binary ready. Compilers:

- ``PoolCompiler`` (the default): kiln.inductor's one Triton compile pool (compile_pool.py), the
  worker processes code generation uses too, for the device's target or a cross-compile target.
- ``DeviceCompiler``: kiln.runtime's ``compile_on_threads`` (triton's ``AsyncCompileMode``: ``fn.warmup``
  hands each compile to a thread; the binaries land in each function's in-memory cache): the fallback
  where there are no worker processes.
- ``TargetCompiler``: an explicit target (e.g. ``cuda:90``) without a GPU, in this process (the
  compile pool's ``in_process`` batch): the cross-compile fallback.
- ``NoCompile``: the Triton interpreter (tests) runs Python, there is nothing to compile.

Jobs whose turn comes after the tuning deadline are skipped (they keep their defaults anyway).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from kiln.graph import log
from kiln.runtime.triton_compile import MAX_THREADS, compile_on_threads, thread_count

from ..compile_pool import (
    PROCESS_POOL,
    CompileBatch,
    TritonCompilePool,
    TritonJob,
    in_process,
    parse_target,
)
from ..compile_pool import default_workers as pool_workers


@dataclass(frozen=True, slots=True)
class CompileJob:
    fn: Any  # a triton JITFunction
    dtypes: tuple[torch.dtype, ...]  # its pointer arguments, in order (they come first)
    constants: tuple[tuple[str, int], ...]  # constexpr arguments by name
    num_warps: int
    num_stages: int
    label: str = ""  # for logs

    @property
    def identity(self) -> tuple[int, tuple[torch.dtype, ...], tuple[tuple[str, int], ...], int, int]:
        """Same function, dtypes, constants, warps and stages: one binary (compiled once)."""
        return (id(self.fn), self.dtypes, self.constants, self.num_warps, self.num_stages)


@dataclass
class CompileStats:
    jobs: int = 0  # distinct jobs handed in
    compiled: int = 0  # compiled (or found in triton's cache) here
    failed: int = 0  # failed to compile: the candidate fails again (and is skipped) when timed
    skipped: int = 0  # not started before the deadline
    seconds: float = 0.0
    workers: int = 1
    mode: str = "none"  # "async" | "target" | "serial" | "none"
    errors: list[str] = field(default_factory=list)
    job_seconds: list[tuple[float, str]] = field(default_factory=list)  # (seconds, label) where measured

    def add(self, other: CompileStats) -> None:
        self.jobs += other.jobs
        self.compiled += other.compiled
        self.failed += other.failed
        self.skipped += other.skipped
        self.seconds += other.seconds
        self.workers = max(self.workers, other.workers)
        if other.mode != "none":
            self.mode = other.mode
        self.errors += other.errors[:5]
        self.job_seconds += other.job_seconds


class Compiler(Protocol):
    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats: ...


def distinct(jobs: Sequence[CompileJob]) -> list[CompileJob]:
    seen: dict[tuple[Any, ...], CompileJob] = {}
    for j in jobs:
        seen.setdefault(j.identity, j)
    return list(seen.values())


class DeviceCompiler:
    """Compile for the current CUDA device in this process, on ``workers`` threads (kiln.runtime's
    ``compile_on_threads``: triton's AsyncCompileMode): the fallback where there are no compile workers."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or thread_count(MAX_THREADS)

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), workers=self.workers)
        if not jobs:
            return stats
        t0 = time.perf_counter()
        done = compile_on_threads([_warmup(j) for j in jobs], self.workers, deadline)
        stats.mode = done.mode
        stats.workers = self.workers if done.mode == "async" else 1
        stats.skipped = done.skipped
        stats.failed = len(done.errors)
        stats.errors += [f"{jobs[i].label}: {error}" for i, error in done.errors]
        stats.seconds = time.perf_counter() - t0
        stats.compiled = max(0, stats.jobs - stats.failed - stats.skipped)
        return stats


def _warmup(j: CompileJob) -> Callable[[], Any]:
    def warm() -> Any:
        return j.fn.warmup(*j.dtypes, grid=(1,), **dict(j.constants), num_warps=j.num_warps,
                           num_stages=j.num_stages)
    return warm


class TargetCompiler:
    """Compile for an explicit GPU target without a GPU, in this process, one after another (the compile
    pool's ``in_process`` batch, as code generation's cross-compiles do without workers); compile-only."""

    def __init__(self, target: str) -> None:
        self.target = parse_target(target, "KILN_AUTOTUNE_CROSS_TARGET")

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), mode="target")
        t0 = time.perf_counter()
        pooled = [(j, pool_job(j)) for j in jobs]
        for j, t in pooled:
            if t is None:
                stats.failed += 1
                stats.errors.append(f"{j.label}: its kernel function has no source file to compile from")
        todo = [(j, t) for j, t in pooled if t is not None]
        batch = in_process([t for _, t in todo], self.target, "max-autotune", deadline=deadline)
        _count(stats, batch, [j for j, _ in todo])
        stats.seconds = time.perf_counter() - t0
        stats.compiled = stats.jobs - stats.failed - stats.skipped
        return stats


def _count(stats: CompileStats, batch: CompileBatch, jobs: Sequence[CompileJob]) -> None:
    """A waited compile-pool batch's outcome, added to ``stats``."""
    report = batch.wait()
    stats.failed += report.failed
    stats.skipped += report.skipped
    stats.errors += report.errors
    stats.job_seconds += [(r[1], j.label) for j, r in zip(jobs, batch.results) if r is not None and r[0] == "ok"]


class PoolCompiler:
    """Compile on kiln.inductor's one Triton compile pool (compile_pool.py), shared with code generation:
    worker processes, because triton's compile holds the GIL most of its time (threads barely overlap),
    which compile for ``target`` (the device's, or a cross-compile target) into triton's on-disk cache,
    where the timed launch finds the binary. Jobs the pool cannot take (no worker processes:
    ``KILN_TRITON_COMPILE_WORKERS=0``; a kernel whose function has no source file) go to ``fallback``
    (the thread compilers above), logged."""

    def __init__(self, target: tuple[str, int, int], fallback: Compiler, pool: TritonCompilePool = PROCESS_POOL,
                 mode: str = "process") -> None:
        self.target, self.fallback, self.pool, self.mode = target, fallback, pool, mode

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), mode=self.mode)
        if not jobs:
            return stats
        t0 = time.perf_counter()
        pooled = [(j, pool_job(j)) for j in jobs]
        left = [j for j, t in pooled if t is None]
        todo = [(j, t) for j, t in pooled if t is not None]
        batch = self.pool.submit([t for _, t in todo], self.target, f"max-autotune ({len(todo)} candidates)",
                       deadline=deadline) if todo else None
        if batch is None:
            left = list(jobs)
        else:
            stats.workers = pool_workers()
            _count(stats, batch, [j for j, _ in todo])
        if left:
            log("perf_hints").info("max-autotune: %d candidate(s) compiled in this process instead of the "
                                   "compile pool", len(left))
            stats.add(self.fallback(left, deadline))
            stats.jobs -= len(left)
            stats.mode = self.mode
        stats.seconds = time.perf_counter() - t0
        stats.compiled = stats.jobs - stats.failed - stats.skipped
        if stats.errors:
            log("perf_hints").info("max-autotune: %d candidate(s) failed to compile, e.g. %s", stats.failed,
                                   stats.errors[0])
        return stats


def pool_job(job: CompileJob) -> TritonJob | None:
    """The compile pool's job for a candidate, or None when its function has no source file."""
    inner = getattr(job.fn, "fn", None)
    try:
        path = inspect.getsourcefile(inner) if inner is not None else None
    except TypeError:
        path = None
    if not path or inner is None:
        return None
    dtypes = tuple(str(d).removeprefix("torch.") for d in job.dtypes)
    return TritonJob(path, inner.__module__, inner.__name__, dtypes, tuple(job.constants), job.num_warps,
                     job.num_stages, label=job.label)


class NoCompile:
    """The Triton interpreter: nothing to compile ahead (counted, so tests see the batch)."""

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        return CompileStats(jobs=len(distinct(jobs)), mode="none")
