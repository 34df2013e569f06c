"""Compile every autotuning candidate of a compile together, before any is timed.

Triton compiles a kernel in 0.1-1 s (a matmul template with 3-5 pipeline stages is the slow end);
compiled one after another at first launch, a GPT-2's few hundred candidates took minutes. Like
torch.compile's max-autotune, kiln compiles them all first, in parallel, then times them serially.

A ``CompileJob`` is one (kernel function, argument dtypes, constexprs, warps, stages): exactly what
the timed launch will specialise on, so the launch finds the binary ready. Compilers:

- ``DeviceCompiler``: triton's ``AsyncCompileMode`` over a thread pool (``fn.warmup`` hands each
  compile to the pool; the binaries land in each function's in-memory cache). triton's compile
  releases the GIL in its MLIR passes and runs ptxas as a subprocess, so threads overlap.
- ``TargetCompiler``: ``triton.compile`` for an explicit target (e.g. ``cuda:90``) on a thread pool,
  needing no GPU: what a cross-compile on a CPU host measures (compile-only; nothing is timed).
- ``ProcessCompiler``: the same on spawned worker processes (the default with more than one worker):
  triton's compile holds the GIL for most of its time, so threads barely overlap (measured: 2 threads
  compiled 6 matmul templates for sm90 slower than 1 on a 2-core host).
- ``NoCompile``: the Triton interpreter (tests) runs Python, there is nothing to compile.

Jobs whose turn comes after the tuning deadline are skipped (they keep their defaults anyway).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from kiln.graph import log

from ..knobs import worker_environment


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


JOB_TIMEOUT_S = 300.0  # one compile may take this long past the tuning deadline before its worker is stopped


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 32))


class _DeadlineExecutor(Executor):
    """Runs submitted work on ``pool`` unless the deadline passed when its turn comes."""

    def __init__(self, pool: Executor, deadline: float, stats: CompileStats) -> None:
        self.pool, self.deadline, self.stats = pool, deadline, stats
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def guarded() -> Any:
            if time.perf_counter() > self.deadline:
                with self.lock:
                    self.stats.skipped += 1
                raise TimeoutError("max-autotune budget spent before this candidate compiled")
            return fn(*args, **kwargs)
        return self.pool.submit(guarded)


def distinct(jobs: Sequence[CompileJob]) -> list[CompileJob]:
    seen: dict[tuple[Any, ...], CompileJob] = {}
    for j in jobs:
        seen.setdefault(j.identity, j)
    return list(seen.values())


class DeviceCompiler:
    """Compile for the current CUDA device through triton's AsyncCompileMode on ``workers`` threads."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        import triton

        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), workers=self.workers)
        if not jobs:
            return stats
        t0 = time.perf_counter()
        if hasattr(triton, "AsyncCompileMode") and self.workers > 1:
            stats.mode = "async"
            with ThreadPoolExecutor(min(self.workers, len(jobs))) as pool:
                ex = _DeadlineExecutor(pool, deadline, stats)
                with triton.AsyncCompileMode(ex, ignore_errors=True):
                    for j in jobs:
                        _warmup(j, stats)
        else:  # a triton without AsyncCompileMode: at least compile before timing, one by one
            stats.mode, stats.workers = "serial", 1
            for j in jobs:
                if time.perf_counter() > deadline:
                    stats.skipped += 1
                    continue
                _warmup(j, stats)
        stats.seconds = time.perf_counter() - t0
        stats.compiled = max(0, stats.jobs - stats.failed - stats.skipped)
        return stats


def _warmup(j: CompileJob, stats: CompileStats) -> None:
    try:
        j.fn.warmup(*j.dtypes, grid=(1,), **dict(j.constants), num_warps=j.num_warps, num_stages=j.num_stages)
    except Exception as e:  # noqa: BLE001 - the candidate fails again when timed, and is skipped there
        stats.failed += 1
        stats.errors.append(f"{j.label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


_TRITON_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}


def parse_target(text: str) -> tuple[str, int, int]:
    """``"cuda:90"`` -> ("cuda", 90, 32); ``"hip:gfx942"`` is not supported (CUDA targets only)."""
    backend, _, arch = text.partition(":")
    if backend != "cuda" or not arch.isdigit():
        raise ValueError(f"KILN_AUTOTUNE_CROSS_TARGET={text!r}: expected 'cuda:<sm>' such as 'cuda:90' (H100/H200)")
    return ("cuda", int(arch), 32)


class TargetCompiler:
    """Compile for an explicit GPU target without a GPU (``triton.compile``); compile-only."""

    def __init__(self, target: str, workers: int | None = None) -> None:
        self.target = parse_target(target)
        self.workers = workers or default_workers()

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), workers=self.workers, mode="target")
        target = GPUTarget(*self.target)
        lock = threading.Lock()

        def one(j: CompileJob) -> None:
            if time.perf_counter() > deadline:
                with lock:
                    stats.skipped += 1
                return
            consts = dict(j.constants)
            dtypes = iter(j.dtypes)
            t = time.perf_counter()
            try:
                sig = {name: "constexpr" if name in consts else "*" + _TRITON_TYPES[next(dtypes)]
                       for name in j.fn.arg_names}
                src = ASTSource(j.fn, signature=sig, constexprs={k: v for k, v in consts.items() if k in sig})
                triton.compile(src, target=target, options={"num_warps": j.num_warps, "num_stages": j.num_stages})
                stats.job_seconds.append((time.perf_counter() - t, j.label))
            except Exception as e:  # noqa: BLE001 - counted, like a candidate that fails on the device
                with lock:
                    stats.failed += 1
                stats.errors.append(f"{j.label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max(1, min(self.workers, len(jobs)))) as pool:
            list(pool.map(one, jobs))
        stats.seconds = time.perf_counter() - t0
        stats.compiled = stats.jobs - stats.failed - stats.skipped
        if stats.errors:
            log("perf_hints").info("max-autotune: %d candidate(s) failed to compile for %s, e.g. %s",
                                   stats.failed, self.target, stats.errors[0])
        return stats


class ProcessCompiler:
    """Compile on worker processes (``kiln_autotune_worker.py`` run as a script, so each starts by
    importing triton alone): for the current GPU (``target=None``: workers run the JIT's own warmup and
    the parent's launch then loads the binary from triton's on-disk cache) or for an explicit target
    (cross-compiling). Processes, not threads: triton's compile holds the GIL most of its time. The
    workers start on the first batch and are kept for the session (``close``). If they cannot start
    or die, ``fallback`` compiles what is left (logged)."""

    def __init__(self, workers: int | None = None, target: str = "", fallback: Compiler | None = None) -> None:
        self.workers = workers or default_workers()
        self.target = parse_target(target) if target else None
        self.fallback = fallback
        self._procs: list[subprocess.Popen[str]] = []

    def _start(self) -> list[subprocess.Popen[str]]:
        if not self._procs:
            script = os.path.join(os.path.dirname(__file__), "kiln_autotune_worker.py")
            env = worker_environment()
            self._procs = [subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True, env=env) for _ in range(self.workers)]
        return self._procs

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        from .kiln_autotune_worker import job_args

        jobs = distinct(jobs)
        stats = CompileStats(jobs=len(jobs), workers=self.workers, mode="process")
        if not jobs:
            return stats
        t0 = time.perf_counter()
        wall_deadline = time.time() + (deadline - t0)
        queue = [(j, job_args(j, self.target, wall_deadline)) for j in jobs]
        left = [j for j, a in queue if a is None]  # no source file (or a dead worker's): compiled here
        todo = [(j, a) for j, a in queue if a is not None]
        lock = threading.Lock()

        def serve(proc: subprocess.Popen[str]) -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    j, a = todo.pop(0)
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(json.dumps(a) + "\n")
                    proc.stdin.flush()
                    # a compile that hangs must not hang the compile: the worker is killed after
                    # JOB_TIMEOUT_S past the deadline (one result line per job: nothing is buffered)
                    wait = max(0.0, wall_deadline - time.time()) + JOB_TIMEOUT_S
                    if not select.select([proc.stdout], [], [], wait)[0]:
                        proc.kill()
                        with lock:
                            stats.failed += 1
                            stats.errors.append(f"{j.label}: compile did not finish in time; worker stopped")
                        return
                    status, seconds, error = json.loads(proc.stdout.readline())
                except (OSError, ValueError, AssertionError):  # the worker died: its job goes back
                    with lock:
                        left.append(j)
                    return
                with lock:
                    if status == "ok":
                        stats.job_seconds.append((seconds, j.label))
                    elif status == "skipped":
                        stats.skipped += 1
                    else:
                        stats.failed += 1
                        stats.errors.append(f"{j.label}: {error}")

        try:
            threads = [threading.Thread(target=serve, args=(p,), daemon=True) for p in self._start()]
        except OSError as e:
            log("perf_hints").warning("max-autotune: compile workers could not start (%s); compiling in this "
                                      "process", e)
            threads, left = [], [j for j, _ in queue]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        left += [j for j, _ in todo]
        if left:
            if self.fallback is None:
                raise RuntimeError(f"max-autotune: {len(left)} candidates could not be compiled by the workers")
            log("perf_hints").info("max-autotune: %d candidate(s) compiled in this process instead", len(left))
            stats.add(self.fallback(left, deadline))
            stats.jobs -= len(left)
            stats.mode = "process"
        stats.seconds = time.perf_counter() - t0
        stats.compiled = stats.jobs - stats.failed - stats.skipped
        if stats.errors:
            log("perf_hints").info("max-autotune: %d candidate(s) failed to compile, e.g. %s", stats.failed,
                                   stats.errors[0])
        return stats

    def close(self) -> None:
        for p in self._procs:
            try:
                if p.stdin is not None:
                    p.stdin.close()  # the worker ends at end of input
                p.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                p.kill()
        self._procs = []

    def __del__(self) -> None:
        self.close()


class NoCompile:
    """The Triton interpreter: nothing to compile ahead (counted, so tests see the batch)."""

    def __call__(self, jobs: Sequence[CompileJob], deadline: float) -> CompileStats:
        return CompileStats(jobs=len(distinct(jobs)), mode="none")
