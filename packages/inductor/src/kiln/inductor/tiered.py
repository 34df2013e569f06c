"""``InductorOptions(wrapper="tiered")``: the Python wrapper at once, the C++ wrapper once it is built.

Note: why. The C++ wrapper (cpp_graph.py) takes a compiled graph's host work out of Python (a few us per
ATen call instead of 12-20: a host-bound language model's steady time), but building it runs g++ over
libtorch's headers, seconds per graph, which ``wrapper="cpp"`` adds to every compile (the serving stream's
cold wall on the CPU: 8.6 s against the Python wrapper's 2.8 s). Tiered compiles as ``wrapper="python"``
does and returns that graph; the C++ wrapper of the same graph is generated and built on one background
thread (the compiler runs in a subprocess, without the GIL). Once its library is loaded, the next calls
alternate between the two wrappers and are timed, and the calls stay on the faster: the C++ wrapper need
not be faster (its per-input cost once made an Adam step over 32 tensors of 16 elements 120 us a call against
the Python wrapper's 62 on the CPU; 31 against 42 since its inputs stay bare pointers; a tiny Llama's forward:
343 against 573). After that, one attribute store: nothing checked on the call path. A program that exits
before then ran the Python wrapper throughout.

Never silently different: the calls move only when the library lays out every output as the Python
wrapper does (shape, stride, offset, dtype; symbolic sizes compared as expressions). A graph the C++
wrapper cannot run, a failed build or a differing layout keeps the Python wrapper, and perf_hints says
why. A C++ call that raises during the trial does too; the call runs again on the Python wrapper when the
graph writes none of its inputs (else the error reaches the caller: the failed call may have written some).
``wait_tiered()`` blocks until every queued build has finished (benchmarks, tests).

The caller (kiln.compile's inductor backend) asks for it for every graph in default mode (a training
graph's forward and backward are tiered apart), not where CUDA graphs replay the graph.
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import sympy
import torch
from torch import fx

from kiln.graph import CompiledGraph, PortableProgram, annotations_of, log
from kiln.runtime import KernelBuildError
from kiln.runtime.cxx import GraphLibrary, PackageError

from .codegen.cpp_wrapper import CppWrapperUnsupported
from .codegen.cpp_wrapper.graph_call import OutputPlan
from .cpp_graph import build_cpp_graph, load_cpp_graph
from .ir import DynamicShapeUnsupported, TensorRef
from .ir.index import positive_sizes
from .lowering.lower import LoweringError
from .options import InductorOptions
from .size_guards import shape_env_of


class TieredCall:
    """A compiled graph whose calls go to ``call``: the Python wrapper's until the C++ wrapper's library is
    loaded, then both in turn for a trial of ``trial_calls`` calls each (every call still runs once, on one
    of them), then the one measured faster (``tier``: "python", "trial", "cpp"; ``ready`` is set when the
    background build has finished, either way; ``measured``: the trial's median microseconds per call,
    Python then C++)."""

    __slots__ = ("call", "name", "tier", "ready", "program", "measured", "trial_calls", "retry_safe", "sync", "_python",
                 "_cpp", "_times", "_callbacks", "_calls", "_after", "_start", "__weakref__")

    def __init__(self, first: Any, name: str, trial_calls: int, after_calls: int = 0, retry_safe: bool = False,
                 sync: Callable[[], None] | None = None) -> None:
        self._python: Callable[[list], tuple] = first.call_owned
        # a GPU graph's trial calls wait for its device before and after (``_try``)
        self.sync = sync
        # the graph writes none of its inputs: a C++ call that fails partway left nothing the caller sees, so
        # the Python wrapper may run the same call again (``_try``)
        self.retry_safe = retry_safe
        # after_calls > 0: calls are counted and the build starts at that count (``start``)
        self.call = self._count if after_calls > 0 else self._python
        self._calls, self._after = 0, after_calls
        self._start: Callable[[], None] | None = None
        self.name = name
        self.tier = "python"
        self.trial_calls = trial_calls
        self.ready = threading.Event()
        self.program: PortableProgram | None = None  # the C++ wrapper's, once its calls go there for good
        self.measured: tuple[float, float] | None = None
        self._cpp: Callable[[list], tuple] | None = None
        self._times: tuple[list[float], list[float]] = ([], [])
        self._callbacks: list[Callable[[PortableProgram], None]] = []
        _LIVE.add(self)

    def _count(self, args: list) -> tuple:
        """A call before the build: counted; the one reaching ``after_calls`` queues the build once it has
        run. Not before: the build lowers and generates the graph again in Python on its thread, and the
        first call of a GPU graph (``after_calls`` 1) is itself mostly Python -- waiting for its kernels,
        then their first launches -- so the two would share the GIL and the first call, the latency a user
        sees as compile time, would wait for the build's turns."""
        self._calls += 1
        if self._calls < self._after:
            return self._python(args)
        start, self._start = self._start, None
        self.call = self._python
        try:
            return self._python(args)
        finally:
            if start is not None:
                start()

    def later(self, callback: Callable[[PortableProgram], None]) -> None:
        """``callback(program)`` with the C++ wrapper's portable program once the calls moved to it for
        good (CompiledGraph.later), on the build thread; never called when the Python wrapper stays."""
        with _BUILDS.cond:
            program = self.program if self.tier == "cpp" else None
            if program is None:
                if self.tier == "trial" or not self.ready.is_set():  # not decided yet
                    self._callbacks.append(callback)
                return
        callback(program)

    def _built(self, library: GraphLibrary, program: PortableProgram) -> None:
        """The library is loaded: the trial starts with the next call (or the move, without a trial)."""
        self._cpp, self.program = library.call_owned, program
        if self.trial_calls <= 0:
            self._settle(True)
            return
        self.tier, self.call = "trial", self._try

    def _try(self, args: list) -> tuple:
        """One trial call: the wrapper with fewer timed calls so far (Python first), timed. A GPU graph's call
        is timed from an idle device to its kernels' end (``sync``): host time alone favours the C++ wrapper
        where the kernels are the step's time (AMP GPT-2 training on an H100: 0.91x the Python wrapper's
        step on the C++ one) -- except while a CUDA graph is being captured, where it is not timed."""
        py, cc = self._times
        cpp = self._cpp
        run = cpp if cpp is not None and len(cc) < len(py) else self._python
        on_cpp = run is cpp
        again = list(args) if on_cpp and self.retry_safe else None  # (the call empties ``args``)
        sync = self.sync if self.sync is not None and not _capturing() else None
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        try:
            out = run(args)
        except Exception as e:
            if not on_cpp:
                raise
            self._failed(e, again is not None)
            if again is None:
                raise  # inputs the failed call may have written: the caller sees it (later calls run on Python)
            return self._python(again)
        if sync is None and self.sync is not None:
            return out  # (captured into a CUDA graph: not a time)
        if sync is not None:
            sync()
        (cc if on_cpp else py).append(time.perf_counter() - t0)
        if len(cc) >= self.trial_calls and self.tier == "trial":  # (a call in another thread may have settled it)
            py_us, cc_us = (1e6 * statistics.median(t[1:] or t) for t in (py, cc))  # the first of each: warm-up
            self.measured = (py_us, cc_us)
            self._settle(cc_us <= py_us * KEEP_CPP_WITHIN)
        return out

    def _failed(self, e: Exception, retried: bool) -> None:
        """The C++ wrapper raised in its trial: the graph stays on the Python wrapper for good."""
        self.call, self.tier, self.program, self._cpp = self._python, "python", None, None
        with _BUILDS.cond:
            self._callbacks.clear()
        log("perf_hints").warning("graph %r keeps the Python wrapper (wrapper='tiered'): its C++ wrapper failed in "
                                  "its trial (%s: %s); %s", self.name, type(e).__name__, str(e)[:300],
                                  "the call ran again on the Python wrapper" if retried else
                                  "the error reached the caller (the graph writes its inputs)")

    def _settle(self, cpp: bool) -> None:
        program = self.program
        if not cpp or program is None or self._cpp is None:
            # (``_cpp`` stays: a call in another thread may be inside ``_try`` still)
            self.call, self.tier, self.program = self._python, "python", None
            with _BUILDS.cond:
                self._callbacks.clear()
            log("perf_hints").info("graph %r keeps the Python wrapper (wrapper='tiered'): its C++ wrapper measured "
                                   "%.1f us a call against %.1f", self.name, *reversed(self.measured or (0, 0)))
            return
        self.call, self.tier = self._cpp, "cpp"
        with _BUILDS.cond:
            callbacks, self._callbacks = self._callbacks, []
        if self.measured is not None:
            log("perf_hints").info("graph %r: calls go to its C++ wrapper (measured %.1f us a call against the Python "
                                   "wrapper's %.1f)", self.name, self.measured[1], self.measured[0])
        if callbacks:  # the graph cache's store writes the library's bytes: not on the caller's call
            _BUILDS.submit(lambda: _hand_on(self.name, program, callbacks))

    def __call__(self, *args: Any) -> tuple:
        return self.call(list(args))

    def call_owned(self, args: list) -> tuple:
        return self.call(args)


def _capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a CUDA graph (a synchronize would break it)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _hand_on(name: str, program: PortableProgram, callbacks: list[Callable[[PortableProgram], None]]) -> None:
    for callback in callbacks:
        try:
            callback(program)
        except Exception as e:  # noqa: BLE001 - storing it elsewhere must not undo the move
            log("perf_hints").warning("graph %r: handing its C++ wrapper program on failed (%s: %s)",
                                      name, type(e).__name__, e)


# the C++ wrapper keeps the calls unless the trial measured it this much slower than the Python one
# (equal within noise: a GPU-bound graph's calls wait for the same kernels; the C++ one frees the host)
KEEP_CPP_WITHIN = 1.05


class _Builds:
    """One daemon thread running queued builds in order (one g++ at a time beside the program), and a
    count of those not finished. Daemon: a program does not wait at exit for builds it will not use."""

    def __init__(self) -> None:
        self.jobs: deque[Callable[[], None]] = deque()
        self.cond = threading.Condition()
        self.pending = 0
        self.thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self.cond:
            self.jobs.append(job)
            self.pending += 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="kiln-cpp-wrapper-builds", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                job = self.jobs.popleft()
            try:
                job()
            finally:
                with self.cond:
                    self.pending -= 1
                    self.cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.pending == 0, timeout)


_BUILDS = _Builds()
_LIVE: weakref.WeakSet[TieredCall] = weakref.WeakSet()


def live_tiered() -> list[TieredCall]:
    """The tiered graphs still alive in this process (``tier``: the wrapper their calls go to now)."""
    return list(_LIVE)


def build_tiered_now() -> int:
    """Queue the C++ wrapper builds of the live tiered graphs still counting calls toward
    ``tiered_after_calls`` (a benchmark measuring the steady state; ``wait_tiered`` then waits for them);
    how many were queued."""
    queued = 0
    for fn in live_tiered():
        start, fn._start = fn._start, None
        if start is not None:
            fn.call = fn._python
            start()
            queued += 1
    return queued


def wait_tiered(timeout: float | None = None) -> bool:
    """Block until every queued C++ wrapper build has finished (loaded, or given up: perf_hints says
    which); False if ``timeout`` seconds passed first."""
    return _BUILDS.wait(timeout)


def tier_up(compiled: CompiledGraph, gm: fx.GraphModule, inputs: Sequence[Any], options: InductorOptions,
            name: str) -> CompiledGraph:
    """``compiled`` (the Python wrapper's graph over ``gm``'s lifted inputs) with its calls moving to the
    C++ wrapper's library when the background thread has built it."""
    # the build starts after the graph's first call at the earliest: by then this thread has compiled the
    # program's other graphs (a training step's backward, after its forward) over the same FakeTensorMode and
    # ShapeEnv, which the build runs passes in too and which are not thread-safe (two threads in one fake
    # mode raise "AssertionError: False, True" in one of them: a failed build, or a failed compile)
    after = max(options.tiered_after_calls, 1)
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    fn = TieredCall(compiled.fn, name, options.tiered_trial_calls, after,
                    retry_safe=not annotations_of(gm).input_mutations, sync=torch.cuda.synchronize if on_gpu else None)
    outputs = compiled.loop_program.outputs if compiled.loop_program is not None else None  # type: ignore[attr-defined]
    cpp_options = options.replace(wrapper="cpp")
    ref = weakref.ref(fn)  # a graph dropped before its turn (a recompile replaced it) is not built

    def start() -> None:
        _BUILDS.submit(lambda: _build(ref, gm, inputs, cpp_options, name, outputs))
    fn._start = start
    return replace(compiled, fn=fn, backend="inductor(tiered wrapper)", later=fn.later, improves=True)


def _build(ref: weakref.ref[TieredCall], gm: fx.GraphModule, inputs: Sequence[Any], options: InductorOptions,
           name: str, outputs: Sequence[Any] | None) -> None:
    fn = ref()
    if fn is None:
        return
    t0 = time.perf_counter()
    try:
        with positive_sizes(shape_env_of(inputs)):
            built = build_cpp_graph(gm, inputs, options=options, name=name)
        why = "the Python wrapper's outputs are unknown" if outputs is None else _differs(outputs, built.plan)
        if why is not None:
            log("perf_hints").warning("graph %r keeps the Python wrapper (wrapper='tiered'): the C++ wrapper %s",
                                      name, why)
            return
        loaded = load_cpp_graph(built, name)
        assert isinstance(loaded.fn, GraphLibrary) and loaded.portable is not None
        log("perf_hints").info("graph %r: its C++ wrapper built in %.1f s in the background; %s", name,
                               time.perf_counter() - t0, f"the next {2 * fn.trial_calls} calls time both wrappers"
                               if fn.trial_calls > 0 else "calls go to it now")
        fn._built(loaded.fn, loaded.portable)
    except (CppWrapperUnsupported, LoweringError, KernelBuildError, PackageError, DynamicShapeUnsupported) as e:
        log("perf_hints").warning("graph %r keeps the Python wrapper (wrapper='tiered'): %s", name, e)
    except Exception as e:  # noqa: BLE001 - a background build must never break the graph that runs
        log("perf_hints").warning("graph %r keeps the Python wrapper (wrapper='tiered'): building its C++ wrapper "
                                  "failed in kiln (%s: %s); please report this", name, type(e).__name__, e)
    finally:
        fn.ready.set()


def _same(a: Any, b: Any) -> bool:
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def _differs(outputs: Sequence[Any], plan: Sequence[OutputPlan]) -> str | None:
    """Why the library's outputs would differ from the Python wrapper's (``outputs``: its program's),
    or None when every output has the same shape, strides, offset and dtype."""
    if len(outputs) != len(plan):
        return f"returns {len(plan)} outputs, the Python wrapper {len(outputs)}"
    for k, (o, p) in enumerate(zip(outputs, plan)):
        if not isinstance(o, TensorRef):
            return f"cannot return output {k} (a {type(o).__name__})"
        if o.dtype != p.dtype or len(o.shape) != len(p.shape) or not all(
                _same(a, b) for a, b in zip((*o.shape, *o.stride), (*p.shape, *p.stride))):
            return (f"lays output {k} out as {p.dtype} {tuple(p.shape)} strided {tuple(p.stride)}, the Python "
                    f"wrapper as {o.dtype} {tuple(o.shape)} strided {tuple(o.stride)}")
        if p.kind != "input" and not _same(o.offset, p.offset):
            return f"puts output {k} at storage offset {p.offset}, the Python wrapper at {o.offset}"
    return None
