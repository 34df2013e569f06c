"""The backends registry: name -> factory(CompileOptions) -> Backend (torch.compile's contract).

Built-in backends are filled in one place, ``_BUILTIN``; users add theirs with ``register_backend``.
A backend whose stage is missing raises BackendUnavailable naming the stage; nothing pretends to
compile.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from kiln.graph import (
    Backend,
    BackendUnavailable,
    CompiledFn,
    CompiledGraph,
    ExampleInput,
    GraphCompiled,
    GraphRunEagerly,
    annotations_of,
    dump,
    emit,
    keeping_texts,
    log,
    new_graph_id,
    print_graph,
)
from kiln.settings import CompileOptions

BackendFactory = Callable[[CompileOptions], Backend]


@dataclass(frozen=True)
class BackendEntry:
    name: str
    factory: BackendFactory
    doc: str


def _stage(module: str, attr: str, backend: str) -> Any:
    """Fetch ``module.attr`` or explain which stage the backend is missing."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BackendUnavailable(
            f"backend {backend!r} needs {module}.{attr}, which is not available ({e}). "
            f"Install the {module.replace('.', '-')} package, or pick another backend from "
            f"kiln.list_backends()."
        ) from e


def _eager(opts: CompileOptions) -> Backend:
    def eager(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledGraph:
        try:
            portable = _stage("kiln.autograd", "render_graph_module", "eager")(gm)
        except (ValueError, BackendUnavailable):
            portable = None  # still runs; only aot_compile needs the portable form, and says so
        return CompiledGraph(gm.forward, "eager", {"graph": print_graph(gm)}, portable)
    return eager


def graph_wrapper(named: str | None, gpu_default: str, *, on_gpu: bool, cudagraphs: bool,
                  cpu_default: str = "python") -> tuple[str, str | None]:
    """The wrapper that runs one compiled graph, and why the one ``options`` named is not used (None if
    it is). The C++ and tiered wrappers serve every graph but those CUDA graphs replay. Unless the options
    name a wrapper, a CUDA graph in default mode, inference or training, gets ``gpu_default``
    (KILN_GPU_WRAPPER: tiered; AMP training on an H100, 2026-12-05: the C++ wrapper's step 1.11x and 1.23x
    the Python one's on ResNet-50 and Llama-350M, 0.91x on GPT-2, whose graphs the trial may keep on
    Python), and a CPU graph ``cpu_default`` (KILN_CPU_WRAPPER: tiered, after KILN_TIER_AFTER_CALLS calls)."""
    if named is None:
        if not on_gpu:
            return cpu_default, None
        return (gpu_default if not cudagraphs else "python"), None
    if named in ("cpp", "tiered") and cudagraphs and on_gpu:
        return "python", "CUDA graphs replay it"
    return named, None


def _aot_eager(opts: CompileOptions) -> Backend:
    aot_eager = _stage("kiln.autograd", "aot_eager", "aot_eager")
    trace_error = _stage("kiln.autograd", "AutogradTraceError", "aot_eager")

    def backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        try:
            return aot_eager(gm, example_inputs)
        except trace_error as e:  # as the inductor backend: run op by op, and say so
            return _op_by_op(gm, e, "aot_eager")
    return backend


def _op_by_op(gm: fx.GraphModule, error: BaseException, backend: str) -> CompiledGraph:
    """The graph run op by op with torch's autograd where kiln.autograd cannot trace it (e.g. a backward a
    library registered reads a value with .item(), HF Mixtral's grouped matmul on the GPU), logged and
    counted as a graph run eagerly (``explain()``)."""
    msg = f"graph is not compiled, it runs op by op with torch's autograd: {error}"
    log("perf_hints").warning(msg)
    log("graph_breaks").info(msg)
    emit(GraphRunEagerly(gm.__class__.__name__, msg))
    return CompiledGraph(gm.forward, f"{backend}(eager fallback)", {"fallbacks": msg}, None)


def _inductor(opts: CompileOptions) -> Backend:
    aot = _stage("kiln.autograd", "aot", "inductor")
    compile_graph = _stage("kiln.inductor", "compile_graph", "inductor")
    options_cls = _stage("kiln.inductor", "InductorOptions", "inductor")
    table = _stage("kiln.inductor", "inductor_decompositions", "inductor")()
    flags = _stage("kiln.inductor.autotune", "mode_flags", "inductor")(opts.mode)
    wrap_reduce_overhead = _stage("kiln.inductor.cudagraphs", "wrap_reduce_overhead", opts.mode)
    graph_options_cls = _stage("kiln.inductor.cudagraphs", "CUDAGraphOptions", opts.mode)
    warm_compile_pool = _stage("kiln.inductor", "warm_compile_pool", "inductor")
    trace_error = _stage("kiln.autograd", "AutogradTraceError", "inductor")
    try:
        inductor_options = options_cls(mode=opts.mode, max_autotune=flags.autotune, **dict(opts.options))
    except TypeError as e:
        raise ValueError(f"kiln.compile(options=...): {e}; see kiln.inductor.InductorOptions") from e

    # reduce-overhead inference graphs on the GPU: intermediates in one planned arena per call, so the
    # CUDA graph pool holds about the graph's allocated peak (kiln.inductor's InductorOptions.memory_arena)
    user_options = dict(opts.options)
    arena = (flags.cudagraphs and "memory_arena" not in user_options
             and _stage("kiln.inductor.knobs", "KNOBS", "inductor").memory_arena)

    # a CUDA graph in default mode gets the C++ wrapper built in the background unless the
    # options name a wrapper: the Python wrapper's host time (12-20 us an ATen call, 5-10 a launch) is
    # what a host-bound GPU step waits for
    knobs = _stage("kiln.inductor.knobs", "KNOBS", "inductor")
    gpu_wrapper, cpu_wrapper, tier_after = knobs.gpu_wrapper, knobs.cpu_wrapper, knobs.tier_after_calls
    run_aten = _stage("kiln.autograd", "run_graph_compiler", "inductor")
    symbolic_refused = _stage("kiln.inductor", "DynamicShapeUnsupported", "inductor")

    def compiler(static: tuple[int, ...], inference: bool = False, backward: bool = False) -> Backend:
        def compile_one(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledGraph:
            on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
            wrapper, why = graph_wrapper(user_options.get("wrapper"), gpu_wrapper, on_gpu=on_gpu,
                                         cudagraphs=flags.cudagraphs, cpu_default=cpu_wrapper)
            if why:
                log("perf_hints").warning("graph keeps the Python wrapper (options wrapper=%r): %s",
                                          user_options["wrapper"], why)
            # a backward's inputs are its saved activations, handed over (kiln.autograd's call_owned): the
            # C++ wrapper drops each after its last use, as the Python wrapper does
            options = inductor_options.replace(wrapper=wrapper, drop_inputs=backward)
            if wrapper == "tiered" and not on_gpu and "tiered_after_calls" not in user_options and \
                    "wrapper" not in user_options:
                options = options.replace(tiered_after_calls=tier_after)
            if inference and arena and any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
                options = options.replace(memory_arena=True)
            try:
                compiled = compile_graph(gm, example_inputs, options=options)
            except symbolic_refused as e:
                return _symbolic_fallback(run_aten, gm, example_inputs, str(e))
            if not flags.cudagraphs:
                return compiled
            # reduce-overhead: parameters/buffers are static inputs, and so are the inputs the graph
            # mutates (a StaticCache: written at their own address); the rest get static slots
            # (output_strides travel: the backward follows the strides the forward really returns)
            graph_options = graph_options_cls(max_recordings=options.cudagraph_max_recordings,
                                              memory_fraction=options.cudagraph_memory_fraction)
            written = sorted({i for _, i in annotations_of(gm).input_mutations})
            return replace(compiled, fn=wrap_reduce_overhead(compiled.fn, example_inputs, static, options=graph_options,
                                                             written_inputs=written))
        return compile_one

    def inductor(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        # Reached only when the graph cache misses: the Triton compile workers start importing now,
        # while the joint trace, decompositions and lowering run. A warm start compiles nothing and
        # starts none: starting them would cost its first call time for workers it never uses
        if any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
            warm_compile_pool("cuda")
        # the forward (and inference) graph takes the captured graph's inputs first, in order
        static = annotations_of(gm).module_state  # kiln.capture marks parameters and buffers
        try:
            return aot(gm, example_inputs, fw_compiler=compiler(static), bw_compiler=compiler((), backward=True),
                       inference_compiler=compiler(static, inference=True), decompositions=table)
        except trace_error as e:
            return _op_by_op(gm, e, "inductor")
    return inductor


def _symbolic_fallback(run_aten: Backend, gm: fx.GraphModule, example_inputs: Sequence[Any],
                       reason: str) -> CompiledGraph:
    """A symbolic graph kiln.inductor refused (``reason``, its DynamicShapeUnsupported): its ATen graph
    runs op by op (one compile for every size), said in perf_hints, graph_breaks and the graph's texts
    (explain, KILN_DEBUG_DIR, the compile report)."""
    syms = sorted({str(s) for x in example_inputs for s in _free_symbols(x)})
    msg = (f"graph is not compiled by kiln.inductor, its ATen graph runs op by op: it has symbolic sizes "
           f"({', '.join(syms)}) and kiln.inductor refused them: {reason}. One compile serves every size; "
           "compile with dynamic=False for generated kernels per size (recompiled per size)")
    emit(GraphRunEagerly(gm.__class__.__name__, msg))
    log("perf_hints").warning(msg)
    log("graph_breaks").info(msg)
    compiled = run_aten(gm, example_inputs)
    assert isinstance(compiled, CompiledGraph)
    texts = {**compiled.texts, "fallbacks": msg}
    return CompiledGraph(compiled.fn, "inductor(symbolic: ATen fallback)", texts, compiled.portable)


def _free_symbols(x: Any) -> set[Any]:
    if isinstance(x, torch.Tensor):
        return {e for s in (*x.shape, *x.stride()) if isinstance(s, torch.SymInt)
                for e in s.node.expr.free_symbols}
    return set(x.node.expr.free_symbols) if isinstance(x, torch.SymInt) else set()


_BUILTIN: dict[str, BackendEntry] = {
    e.name: e for e in (
        BackendEntry("eager", _eager, "runs the captured torch graph as it is (capture only)"),
        BackendEntry("aot_eager", _aot_eager,
                     "capture + autograd: runs the forward/backward ATen graphs without codegen"),
        BackendEntry("inductor", _inductor,
                     "the full pipeline: capture, autograd, decomp, C++/Triton code generation"),
    )
}
_USER: dict[str, BackendEntry] = {}


def register_backend(fn: Backend | str | None = None, *, name: str | None = None) -> Any:
    """Register a torch.compile-style backend ``fn(gm, example_inputs)``; usable as a decorator, bare
    (the function's name) or named (``@register_backend("mine")`` or ``name="mine"``)."""
    if isinstance(fn, str):
        fn, name = None, fn
    def add(f: Backend) -> Backend:
        key = name or getattr(f, "__name__", None)
        if not key:
            raise ValueError("register_backend: give the backend a name")
        if key in _BUILTIN:
            raise ValueError(f"register_backend: {key!r} is a built-in kiln backend")
        _USER[key] = BackendEntry(key, functools.partial(_constant_backend, f), f.__doc__ or "")
        return f
    return add(fn) if fn is not None else add


def _constant_backend(fn: Backend, opts: CompileOptions) -> Backend:
    return fn


def list_backends() -> list[str]:
    """Names usable as ``kiln.compile(..., backend=NAME)``."""
    return sorted([*_BUILTIN, *_USER])


def backend_doc(name: str) -> str:
    entry = _BUILTIN.get(name) or _USER.get(name)
    return entry.doc if entry else ""


def resolve_backend(backend: str | Backend, opts: CompileOptions) -> Backend:
    """Turn a backend name or callable into a Backend that also dumps each stage's text."""
    if isinstance(backend, str):
        entry = _BUILTIN.get(backend) or _USER.get(backend)
        if entry is None:
            raise ValueError(f"kiln.compile: unknown backend {backend!r}; known: {list_backends()}")
        name = backend
        fn = _with_graph_cache(_build_on_first_miss(entry, opts), name, opts)
    elif callable(backend):
        fn, name = backend, getattr(backend, "__name__", "custom")
    else:
        raise TypeError(f"kiln.compile: backend must be a name or a callable, got {type(backend)}")
    return _observed(fn, name)


# Built-in backends whose compiled graphs are portable programs, stored in the graph cache. Modes that
# wrap the result in CUDA graphs are not cached (the recording is per process).
_GRAPH_CACHED = frozenset({"aot_eager", "inductor"})
_UNCACHED_MODES = frozenset({"reduce-overhead", "max-autotune"})


# The compiler stages each cached built-in backend imports when it is built.
_STAGE_MODULES: dict[str, tuple[str, ...]] = {"aot_eager": ("kiln.autograd",),
                                              "inductor": ("kiln.autograd", "kiln.inductor")}


def _build_on_first_miss(entry: BackendEntry, opts: CompileOptions) -> Backend:
    """``entry``'s backend, built (its stages imported) only when a graph must really be compiled.

    Why: on a warm start every graph is a graph-cache hit, and importing kiln.autograd and
    kiln.inductor (networkx, sympy printers, the decomposition tables) is then wasted time. A
    missing stage is still reported here, at kiln.compile time (found without importing it), and
    ``options`` are validated by building the backend now, as before.
    """
    if entry.name not in _GRAPH_CACHED or opts.options:
        return entry.factory(opts)
    for module in _STAGE_MODULES.get(entry.name, ()):
        if importlib.util.find_spec(module) is None:
            raise BackendUnavailable(
                f"backend {entry.name!r} needs {module}, which is not installed. Install the "
                f"{module.replace('.', '-')} package, or pick another backend from "
                "kiln.list_backends().")
    built: list[Backend] = []

    def backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        if not built:
            built.append(entry.factory(opts))
        return built[0](gm, example_inputs)
    backend.__name__ = entry.name
    return backend


def _with_graph_cache(fn: Backend, name: str, opts: CompileOptions) -> Backend:
    """The caching hook: a second process compiling the same graph loads it from the cache."""
    if name not in _GRAPH_CACHED:
        return fn
    if opts.mode in _UNCACHED_MODES:
        log("cache").info("graph cache bypass (%s): mode %r records CUDA graphs per process",
                          name, opts.mode)
        return fn
    runtime = importlib.import_module("kiln.runtime")
    key_opts = (opts.backend, opts.mode, sorted((k, repr(v)) for k, v in dict(opts.options).items()))
    return runtime.cached_backend(fn, name, key_opts)  # type: ignore[no-any-return]


def _observed(fn: Backend, name: str) -> Backend:
    """Wraps a backend so every compiled graph's stages land in KILN_DEBUG_DIR (and the compile report),
    and each compile is one GraphCompiled event (kiln.stats(), the report)."""
    def backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        graph_id = new_graph_id(f"{name}_{gm.__class__.__name__}")
        if keeping_texts():  # printing a large graph costs ms even when nothing is written
            dump(graph_id, "00_captured_torch", print_graph(gm))
        t0 = time.perf_counter()
        compiled = fn(gm, example_inputs)
        emit(GraphCompiled(name, time.perf_counter() - t0, gm, compiled))
        texts = compiled.texts if isinstance(compiled, CompiledGraph) else {}
        for i, (stage, text) in enumerate(texts.items(), start=1):
            dump(graph_id, f"{i:02d}_{stage}", text)
        log("perf_hints").debug("backend %s compiled graph %s", name, graph_id)
        return compiled
    backend.__name__ = name
    backend.__wrapped__ = fn  # type: ignore[attr-defined]
    return backend
