"""kiln.inductor's one Triton compile pool: kernels compiled in parallel worker processes.

Two users hand it work: code generation (a graph's kernels, compiled while the compile goes on:
codegen/triton/ahead.py) and max-autotune (every candidate of a compile, compiled before any is timed:
autotune/compilers.py ``PoolCompiler``). One set of knobs sizes it: ``KILN_TRITON_COMPILE_WORKERS``
(0: no worker processes; kernels compile in this process, max-autotune's candidates on threads).

A GPU cold compile is mostly triton compiling kernels (10-40 s for a transformer before kernels
identical up to their names shared one function). Compiled in the parent at first launch -- or on a
thread pool, where triton's Python front end and passes hold the GIL -- they barely overlap. Like
torch.compile's compile workers, kiln keeps a pool of worker processes (``compile_worker.py``):

- started early and in the background (``warm_compile_pool()``: at the first compile of a CUDA graph,
  or sooner by the caller), so a worker's imports overlap capture and lowering;
- ``TritonCompilePool.submit(jobs)`` hands a graph's distinct kernel specialisations to the workers and returns at
  once: the forward's kernels compile while the backward is traced, lowered and generated;
- the compiled graph waits for its batch on its first call (``CompileBatch.wait``); the first launch
  of each kernel then loads the binary from triton's on-disk cache (milliseconds).
- on a GPU host, a graph submitted before any worker is ready (the first graph of a process, while the
  workers still import torch and triton) does not wait idle for them: two threads of this process
  compile from the same queue until the first worker is ready, and the workers take the rest.

Workers never touch the GPU: they compile for the target the parent names (its device's, or the
cross-compile target ``KILN_TRITON_CROSS_TARGET=cuda:90`` on a host without one). Where processes
cannot be used (``KILN_TRITON_COMPILE_WORKERS=0``, a worker that cannot start or dies) the kernels
compile in this process instead, and a ``perf_hints`` line says so. A job that fails in a worker is
compiled again at its first launch, where triton reports the error.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.graph import log

from .knobs import KNOBS, triton_interpret, worker_environment

WORKER_SCRIPT = os.path.join(os.path.dirname(__file__), "compile_worker.py")
START_TIMEOUT_S = 120.0  # a worker that has not imported torch and triton by then is given up
JOB_TIMEOUT_S = 300.0  # one compile longer than this: the worker is stopped, the kernel compiles here
SKIPPED = ("skipped", 0.0, "", 0.0)  # a job whose batch's deadline passed before its turn
HELPERS = 2  # threads of this process compiling from the queue while no worker is ready (help_while_starting)


@dataclass(frozen=True, slots=True)
class TritonJob:
    """One kernel specialisation: exactly what the wrapper's first launch specialises on."""

    path: str  # the kernel module's file
    module: str  # its module name (kiln_triton_<hash>)
    function: str
    dtypes: tuple[str, ...]  # pointer arguments' torch dtypes ("bfloat16"), in order
    constants: tuple[tuple[str, int], ...]  # constexpr arguments
    num_warps: int
    num_stages: int
    # the first job of its launcher signature (pointer dtypes, sizes, constexprs): it builds the C launcher
    # triton <= 3.6 needs per signature, the others find it in the cache
    builds_launcher: bool = True
    # size arguments after the pointers (declared unspecialised: one binary for every value; kernel.py)
    sizes: int = 0
    label: str = field(default="", compare=False)  # for logs (max-autotune names the candidate)

    def as_dict(self, target: tuple[str, Any, int] | None, launcher: bool = False) -> dict[str, Any]:
        return {"launcher": launcher and self.builds_launcher, "path": self.path, "module": self.module, "function": self.function, "dtypes": list(self.dtypes),
                "sizes": self.sizes, "constants": [list(c) for c in self.constants], "num_warps": self.num_warps,
                "num_stages": self.num_stages, "target": list(target) if target else None}


@dataclass
class BatchReport:
    jobs: int = 0
    compiled: int = 0
    failed: int = 0
    in_process: int = 0  # compiled in this process (workers unavailable or lost)
    skipped: int = 0  # not started before the batch's deadline (max-autotune's budget)
    seconds: float = 0.0  # from submit to the end of wait
    worker_seconds: float = 0.0  # sum of the jobs' compile times in workers (wall)
    worker_cpu: float = 0.0  # ... in CPU seconds (worker + ptxas): what a many-core host spreads out
    longest_cpu: float = 0.0  # the slowest job's CPU seconds: a floor for the wall time, whatever the cores
    errors: list[str] = field(default_factory=list)


class CompileBatch:
    """A graph's jobs, submitted to the pool (or compiled in this process when ``pool`` is None)."""

    def __init__(self, jobs: Sequence[TritonJob], target: tuple[str, Any, int] | None, label: str,
                 launchers: bool = False, deadline: float | None = None) -> None:
        self.jobs, self.target, self.label = list(jobs), target, label
        self.deadline = deadline  # time.perf_counter() after which jobs not yet started are skipped
        self.launchers = launchers  # also build triton's C launchers (on a GPU host: they load libcuda)
        self.results: list[tuple[str, float, str, float] | None] = [None] * len(self.jobs)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.left = len(self.jobs)
        self.t0 = time.perf_counter()
        self.report: BatchReport | None = None
        if not self.jobs:
            self.done.set()

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def record(self, index: int, result: tuple[str, float, str, float]) -> None:
        with self.lock:
            if self.results[index] is not None:
                return
            self.results[index] = result
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def wait(self) -> BatchReport:
        """Block until every job is compiled (jobs the workers lost compile here); once."""
        if self.report is not None:
            return self.report
        self.done.wait()
        rep = BatchReport(jobs=len(self.jobs))
        for job, res in zip(self.jobs, self.results):
            assert res is not None
            status, seconds, error, cpu = res
            if status == "skipped" or (status == "lost" and self.expired()):
                rep.skipped += 1
                continue
            if status == "lost":  # no pool, or the worker died or hung: compile it here
                rep.in_process += 1
                status, seconds, error, cpu = _compile_here(job, self.target)
            else:
                rep.worker_seconds += seconds
                rep.worker_cpu += cpu
                rep.longest_cpu = max(rep.longest_cpu, cpu)
            if status == "ok":
                rep.compiled += 1
            else:
                rep.failed += 1
                rep.errors.append(f"{job.function}: {error}")
        rep.seconds = time.perf_counter() - self.t0
        if rep.failed:
            log("perf_hints").info("triton: %d of %d kernel(s) of %s failed to compile ahead (they compile at "
                                   "first launch, which reports the error), e.g. %s", rep.failed, rep.jobs,
                                   self.label, rep.errors[0])
        lost = sum(1 for r in self.results if r is not None and r[2] != "no compile worker" and r[0] == "lost")
        if lost:
            log("perf_hints").warning("triton: %d kernel(s) of %s compiled in this process: their compile worker "
                                      "died or timed out", lost, self.label)
        log("perf_hints").debug("triton: %s: %d kernel(s) compiled in %.2f s (%.2f s of worker time)",
                                self.label, rep.jobs, rep.seconds, rep.worker_seconds)
        self.report = rep
        return rep


def _compile_here(job: TritonJob, target: tuple[str, Any, int] | None,
                  launcher: bool = False) -> tuple[str, float, str, float]:
    """In this process: on a GPU with the real driver (``target`` is the device's own), else for ``target``."""
    import torch

    from .compile_worker import compile_job

    own = target if target is not None and not torch.cuda.is_available() else None
    return compile_job(job.as_dict(None, launcher=launcher and own is None), own)


class _Worker:
    def __init__(self, env: dict[str, str], flags: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, WORKER_SCRIPT, *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)

    def read(self, timeout: float) -> tuple[str, float, str, float] | None:
        """One result line; None when the worker died or did not answer in time (it is then stopped)."""
        assert self.proc.stdout is not None
        try:
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                self.proc.kill()
                return None
            line = self.proc.stdout.readline()
            status, seconds, error, cpu = json.loads(line)
        except (OSError, ValueError):
            return None
        return (str(status), float(seconds), str(error), float(cpu))

    def send(self, job: dict[str, Any]) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the worker ends at end of input
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class CompilePool:
    """``workers`` compile processes, each served by a thread of this process taking jobs from one queue."""

    def __init__(self, workers: int, gpu: bool = False) -> None:
        self.size = workers
        self.gpu = gpu  # this host has the GPU the kernels are for: the first worker builds triton's driver helpers
        self.queue: queue.Queue[tuple[CompileBatch, int] | None] = queue.Queue()
        self.alive = 0
        self.ready = 0  # workers that finished their imports and take jobs
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []
        self.threads: list[threading.Thread] = []
        self.error = ""
        self.closing = False
        self.pid = os.getpid()
        self.helpers = 0  # threads of this process taking jobs while no worker is ready

    def start(self, target: tuple[str, Any, int] | None = None) -> bool:
        """Start the workers (non-blocking: they import in the background, then compile a kernel for
        ``target`` to pay triton's first-compile costs: compile_warmup.py); False if none could."""
        env = worker_environment()
        warm = ("--warm=" + json.dumps(list(target)),) if target is not None else ()
        for i in range(self.size):
            try:
                flags = (("--driver-utils",) if self.gpu and i == 0 else ()) + warm
                w = _Worker(env, flags + (("--with-torch",) if KNOBS.triton_worker_torch else ()))
            except OSError as e:
                self.error = f"{type(e).__name__}: {e}"
                break
            self.workers.append(w)
        self.alive = len(self.workers)
        for w in self.workers:
            t = threading.Thread(target=self._serve, args=(w,), name="kiln-triton-compile", daemon=True)
            t.start()
            self.threads.append(t)
        return self.alive > 0

    def submit(self, batch: CompileBatch) -> bool:
        """Queue ``batch``'s jobs; False (nothing queued) when no worker is alive."""
        with self.lock:
            if self.alive == 0:
                return False
            for i in range(len(batch.jobs)):
                self.queue.put((batch, i))
        return True

    def help_while_starting(self) -> None:
        """Until a worker is ready, ``HELPERS`` threads of this process take jobs from the same queue.

        The first graph of a process is lowered in 1-3 s while its workers import torch and triton (3-5 s
        on a 16-core host, all starting at once); waiting for them leaves the GPU host idle, and compiling
        every kernel on the wrapper's thread pool instead holds the GIL for seconds (triton's front end
        and passes are Python). Two threads here keep one kernel in ptxas while the other is in Python;
        the workers take the rest of the queue as they come up."""
        with self.lock:
            start = max(0, HELPERS - self.helpers) if self.ready == 0 else 0
            self.helpers += start
        for _ in range(start):
            threading.Thread(target=self._help, name="kiln-triton-compile-here", daemon=True).start()

    def _help(self) -> None:
        try:
            while self.ready == 0 and not self.closing:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    return
                if item is None:  # close(): the sentinel is a worker thread's
                    self.queue.put(None)
                    return
                batch, i = item
                if batch.expired():
                    batch.record(i, SKIPPED)
                    continue
                try:
                    result = _compile_here(batch.jobs[i], batch.target, batch.launchers)
                except Exception as e:  # noqa: BLE001 - the batch must be answered; its first launch reports it
                    result = ("failed", 0.0, f"{type(e).__name__}: {e}", 0.0)
                batch.record(i, result)
        finally:
            with self.lock:
                self.helpers -= 1

    def _serve(self, w: _Worker) -> None:
        """Feed ``w`` jobs one at a time until the pool closes or the worker is lost; whatever happens,
        the job in hand is answered (a batch never waits forever) and the worker is counted gone."""
        item: tuple[CompileBatch, int] | None = None
        try:
            ready = w.read(START_TIMEOUT_S)
            if ready is None or ready[0] != "ready":
                self._not_started(w)
                return
            with self.lock:
                self.ready += 1
            while True:
                item = self.queue.get()
                if item is None:
                    return
                batch, i = item
                if batch.expired():
                    batch.record(i, SKIPPED)
                    item = None
                    continue
                job = batch.jobs[i].as_dict(batch.target, batch.launchers)
                result = w.read(JOB_TIMEOUT_S) if w.send(job) else None
                if result is None:
                    return  # the worker died or hung (and was stopped): the job is handed back below
                batch.record(i, result)
                item = None
        except Exception as e:  # noqa: BLE001 - a bug here must not leave a batch waiting
            self.error = self.error or f"compile worker thread failed: {type(e).__name__}: {e}"
        finally:
            if item is not None:
                item[0].record(item[1], ("lost", 0.0, "compile worker died or timed out", 0.0))
            self._worker_gone()

    def _not_started(self, w: _Worker) -> None:
        try:
            code: int | None = w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = None
        self.error = self.error or f"a compile worker did not start (exit code {code})"
        log("perf_hints").warning("triton: %s", self.error)

    def _worker_gone(self) -> None:
        with self.lock:
            self.alive -= 1
            last = self.alive == 0
        if not last:
            return
        if not self.closing:
            log("perf_hints").warning("triton: no compile worker left (%s); kernels compile in this process",
                                      self.error or "they exited")
        while True:  # nobody will take what is queued: hand it back to its batches
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].record(item[1], ("lost", 0.0, "no compile worker left", 0.0))

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # a forked child's copy: the workers belong to the parent
        self.closing = True
        for _ in self.threads:
            self.queue.put(None)
        for w in self.workers:
            w.close()
        self.workers, self.threads, self.alive = [], [], 0


def default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 32))


class TritonCompilePool:
    """The compile pool its users hold: code generation (``TritonBackend``) and max-autotune
    (``PoolCompiler``) are handed one and call ``submit``. Its worker processes start on first use
    (``get``), ``workers`` of them (None: ``KILN_TRITON_COMPILE_WORKERS``, else one a core, at most
    32; 0: none, every kernel compiles in the caller's process); a forked child starts its own.
    ``PROCESS_POOL`` is the one a process shares unless a caller passes another (tests do)."""

    def __init__(self, workers: int | None = None, started: CompilePool | None = None) -> None:
        self.workers = workers
        self.lock = threading.Lock()
        self.pool: CompilePool | None = started

    @contextlib.contextmanager
    def using(self, pool: CompilePool | None) -> Iterator[CompilePool | None]:
        """``pool`` serves this holder's users inside the block (the one before comes back after)."""
        with self.lock:
            before, self.pool = self.pool, pool
        try:
            yield pool
        finally:
            with self.lock:
                self.pool = before

    def get(self, target: tuple[str, Any, int] | None = None) -> CompilePool | None:
        """The pool, started on first use (its workers warmed up for ``target`` when given); None where
        worker processes are not used (logged once)."""
        with self.lock:
            pool = self.pool
            if pool is not None and pool.pid != os.getpid():  # a forked child: its parent's workers are not its own
                pool = self.pool = None
            if pool is not None:
                return pool if pool.alive > 0 else None
            workers = self.workers if self.workers is not None else (
                KNOBS.triton_compile_workers if KNOBS.triton_compile_workers >= 0 else default_workers())
            import torch

            pool = self.pool = CompilePool(workers, gpu=torch.cuda.is_available())
            if workers == 0:
                log("perf_hints").info("triton: KILN_TRITON_COMPILE_WORKERS=0: kernels compile in this process")
                return None
            if not pool.start(target):
                log("perf_hints").warning("triton: compile worker processes could not start (%s); kernels compile "
                                          "in this process", pool.error)
                return None
            atexit.register(pool.close)
            if pool.gpu:  # this process loads the workers' binaries: pay triton's one-time key now, aside
                threading.Thread(target=_prime_triton_key, name="kiln-triton-key", daemon=True).start()
            return pool

    def warm(self, target: tuple[str, Any, int] | None = None) -> bool:
        """Start the worker processes now, in the background (warmed up for ``target``); True when there
        is a pool."""
        return self.get(target) is not None

    def submit(self, jobs: Sequence[TritonJob], target: tuple[str, Any, int], label: str,
               deadline: float | None = None) -> CompileBatch | None:
        """Compile ``jobs`` for ``target`` on the pool (returns at once); None when there is no pool.
        Jobs whose turn comes after ``deadline`` (a ``time.perf_counter()``) are skipped."""
        pool = self.get(target)
        if pool is None:
            return None
        batch = CompileBatch(jobs, target, label, launchers=pool.gpu, deadline=deadline)
        if not pool.submit(batch):
            log("perf_hints").warning("triton: the compile workers are gone (%s); %s compiles in this process",
                                      pool.error or "they exited", label)
            return None
        if pool.gpu and pool.ready == 0:
            log("perf_hints").info("triton: compile workers still starting; this process compiles %s's kernels "
                                   "with them until they are ready", label)
            pool.help_while_starting()
        return batch


PROCESS_POOL = TritonCompilePool()  # the process's pool unless a caller hands its users another


def _prime_triton_key() -> None:
    """triton hashes its own sources and its ~100 MB library once per process, at the first compile or
    cache lookup (0.5 s): the first launch of the first kernel. hashlib releases the GIL on large
    buffers, so a background thread does it while this process captures and lowers."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001, S110 - an optimisation; the first lookup computes it otherwise
        pass


def in_process(jobs: Sequence[TritonJob], target: tuple[str, Any, int], label: str,
               deadline: float | None = None) -> CompileBatch:
    """A batch whose jobs compile in this process when it is waited for (no pool), one after another;
    those whose turn comes after ``deadline`` are skipped."""
    batch = CompileBatch(jobs, target, label, deadline=deadline)
    for i in range(len(batch.jobs)):
        batch.record(i, ("lost", 0.0, "no compile worker", 0.0))
    return batch


def parse_target(text: str, knob: str = "KILN_TRITON_CROSS_TARGET") -> tuple[str, int, int]:
    """``"cuda:90"`` -> ("cuda", 90, 32): CUDA targets only."""
    backend, _, arch = text.partition(":")
    if backend != "cuda" or not arch.isdigit():
        raise ValueError(f"{knob}={text!r}: expected 'cuda:<sm>' such as 'cuda:90' (H100/H200)")
    return ("cuda", int(arch), 32)


def device_target() -> tuple[str, int, int] | None:
    """What this process's CUDA device compiles for, as triton's CUDA driver reports it, without making
    that driver here (on a fresh cache it builds a C module first: the compile workers do that while
    this process lowers); None without a usable CUDA device (or ROCm, or the interpreter)."""
    import torch

    if triton_interpret() or not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    try:
        major, minor = torch.cuda.get_device_capability()
    except Exception as e:  # noqa: BLE001 - then the kernels compile in this process, as before
        log("perf_hints").info("triton: no device capability (%s: %s); kernels compile in this process",
                               type(e).__name__, e)
        return None
    return ("cuda", major * 10 + minor, 32)
