"""Triton kernels compiled together on threads of this process: the in-process side of kiln's one
Triton compile pool.

kiln.inductor's compile pool (``kiln/inductor/compile_pool.py``) compiles in worker processes, because
triton's compile holds the GIL most of its time. Where there are no workers -- ``KILN_TRITON_COMPILE_WORKERS=0``,
a wrapper loaded from an artifact or cache entry in a process without kiln.inductor, ROCm -- kernels
still compile together rather than one by one at their first launches, here: each ``fn.warmup`` hands
its compile to a thread pool through triton's ``AsyncCompileMode`` (its MLIR passes release the GIL and
ptxas runs as a subprocess, so threads overlap some). Generated wrappers call ``precompile`` when they
load; max-autotune's in-process fallback calls ``compile_on_threads``. Nothing else in kiln makes a
thread pool for Triton.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .knobs import triton_interpret, triton_precompile
from .triton_notes import KERNEL_NOTES

MAX_THREADS = 32


def thread_count(jobs: int) -> int:
    """Threads for ``jobs`` compiles: one a core, at most ``MAX_THREADS``, never more than the jobs."""
    return max(1, min(jobs, os.cpu_count() or 1, MAX_THREADS))


@dataclass
class ThreadCompile:
    """What ``compile_on_threads`` did: the kernels (triton's futures) by job, failures and skips."""

    kernels: list[Any] = field(default_factory=list)  # one per job: a kernel, a future of one, or None
    errors: list[tuple[int, str]] = field(default_factory=list)  # (job index, "Error: first line")
    skipped: int = 0  # not started before the deadline
    mode: str = "async"  # "async" (threads) | "serial" (a triton without AsyncCompileMode)


class _DeadlineExecutor(Executor):
    """Runs submitted work on ``pool`` unless the deadline passed when its turn comes."""

    def __init__(self, pool: Executor, deadline: float | None, result: ThreadCompile) -> None:
        self.pool, self.deadline, self.result = pool, deadline, result
        self.lock = threading.Lock()

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def guarded() -> Any:
            if self.expired():
                with self.lock:
                    self.result.skipped += 1
                raise TimeoutError("the compile's deadline passed before this kernel's turn")
            return fn(*args, **kwargs)
        return self.pool.submit(guarded)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def compile_on_threads(warmups: Sequence[Callable[[], Any]], threads: int, deadline: float | None = None,
                       ignore_errors: bool = True) -> ThreadCompile:
    """Run each of ``warmups`` (a call of a JIT function's ``warmup``) with its compile handed to one
    of ``threads`` threads; returns once all are compiled. Work whose turn comes after ``deadline``
    (a ``time.perf_counter()``) is skipped. ``ignore_errors=False``: a compile that fails raises when
    the batch ends (triton's AsyncCompileMode reports it)."""
    import triton

    result = ThreadCompile()
    if not hasattr(triton, "AsyncCompileMode") or threads < 2:
        result.mode = "serial"  # at least compile together, one after another
        for i, warm in enumerate(warmups):
            if deadline is not None and time.perf_counter() > deadline:
                result.skipped += 1
                result.kernels.append(None)
                continue
            _warm(i, warm, result)
        return result
    with ThreadPoolExecutor(thread_count(min(threads, len(warmups)))) as pool:
        ex = _DeadlineExecutor(pool, deadline, result)
        with triton.AsyncCompileMode(ex, ignore_errors=ignore_errors):
            for i, warm in enumerate(warmups):
                _warm(i, warm, result)
    return result


def _warm(i: int, warm: Callable[[], Any], result: ThreadCompile) -> None:
    try:
        result.kernels.append(warm())
    except Exception as e:  # noqa: BLE001 - compiled again (and reported) at the kernel's launch
        result.kernels.append(None)
        result.errors.append((i, _first_line(e)))


def run_on_threads(calls: Iterable[Callable[[], Any]], threads: int) -> None:
    """Run ``calls`` on ``threads`` threads (work outside the GIL: the host compiler), errors ignored
    (each is done again, and reported, where its result is needed)."""
    def run(call: Callable[[], Any]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001, S110 - an optimisation; the first launch does it otherwise
            pass
    todo = list(calls)
    if todo:
        with ThreadPoolExecutor(thread_count(min(threads, len(todo)))) as pool:
            list(pool.map(run, todo))


def precompile(items: Sequence[tuple[Any, tuple[Any, ...]]], compiled_ahead: bool = False) -> None:
    """A generated wrapper's kernels compiled together when it loads, instead of one after another at
    each kernel's first launch (a transformer has a few hundred). ``items``: (launcher, warmup
    arguments): pointer dtypes, then a stand-in for each size argument (kiln declares those
    unspecialised, so any value compiles the one binary every size uses). Nothing happens where this cannot run or is not needed (no CUDA,
    the interpreter, a triton without AsyncCompileMode, ``KILN_TRITON_PRECOMPILE=0``, the compile pool's
    workers have them: ``compiled_ahead``); any kernel whose compile fails here compiles again at its
    first launch, where triton reports the error. Kernels whose binaries kiln.runtime already handed to
    triton (an artifact or cache entry: triton_preload.py) are left out."""
    import torch
    import triton

    items = [item for item in items if not KERNEL_NOTES.preloaded(item[0].fn)]
    if (len(items) < 2 or compiled_ahead or triton_interpret() or not triton_precompile()
            or not hasattr(triton, "AsyncCompileMode") or not torch.cuda.is_available()):
        return
    threads = thread_count(len(items))
    try:
        done = compile_on_threads([_launch_warmup(launch, args) for launch, args in items], threads,
                                  ignore_errors=False)
    except Exception:  # noqa: BLE001 - e.g. an AsyncCompileMode of another signature: stay lazy
        return
    prebuild_launchers([k for k in done.kernels if k is not None], threads)


def _launch_warmup(launch: Any, args: tuple[Any, ...]) -> Callable[[], Any]:
    def warm() -> Any:
        return launch.fn.warmup(*args, grid=(1,), **launch.consts, num_warps=launch.num_warps,
                                num_stages=launch.num_stages)
    return warm


def prebuild_launchers(compiled: Sequence[Any], threads: int) -> None:
    """triton <= 3.6 builds a small C launcher per kernel signature with gcc at each kernel's first
    launch (0.2-0.3 s each, one after another: 23 builds were 6.5 s of GPT-2's 22 s training compile on
    an H200). Build the distinct ones now, in parallel (gcc runs outside the GIL), into triton's cache,
    where each first launch finds its launcher. A triton with one generic launcher (no
    ``make_launcher``) has nothing to build; any failure here leaves the build to the first launch."""
    try:
        from triton.backends.nvidia import driver as nvidia_driver
        from triton.runtime import driver
        if not hasattr(nvidia_driver, "make_launcher"):
            return
        launcher_cls = driver.active.launcher_cls  # the driver's lazy set-up, once, on this thread
    except Exception:  # noqa: BLE001 - another backend or triton layout: nothing to prebuild
        return
    distinct: dict[tuple[str, str, str], tuple[Any, Any]] = {}
    for kernel in compiled:
        try:
            if hasattr(type(kernel), "result"):  # a FutureKernel of AsyncCompileMode
                kernel = kernel.result(True)
            src, meta = kernel.src, kernel.metadata
            constants = getattr(src, "constants", {}) or {}
            key = (repr(list(src.signature.items())), repr(sorted(constants.items(), key=repr)),
                   repr(getattr(meta, "tensordesc_meta", None)))
        except Exception:  # noqa: BLE001, S112 - not a kernel this knows: its first launch builds it
            continue
        distinct.setdefault(key, (src, meta))
    run_on_threads([_builder(launcher_cls, pair) for pair in distinct.values()], threads)


def _builder(launcher_cls: Any, pair: tuple[Any, Any]) -> Callable[[], Any]:
    return lambda: launcher_cls(*pair)
