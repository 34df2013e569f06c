"""compile_graph: the entry point (the compile() backend contract, returning a CompiledGraph)."""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import fx

from kiln.graph import KNOBS as GRAPH_KNOBS
from kiln.graph import (
    CompiledGraph,
    ExampleInput,
    GraphRunEagerly,
    PortableProgram,
    StageTime,
    VerifyAfterPass,
    dump,
    emit,
    keeping_texts,
    log,
    new_graph_id,
    run_pipeline,
)
from kiln.runtime import KernelBuildError
from kiln.runtime.cxx import PackageError

from .codegen.cpp import CppBackend
from .codegen.cpp_wrapper import CppWrapperUnsupported
from .codegen.triton.ahead import warm_compile_pool
from .codegen.triton.backend import TritonBackend
from .codegen.wrapper import REQUIRES
from .cpp_graph import compile_cpp_graph
from .graph_passes.lift_constants import WithConstants, constants_epilogue, lift_constants
from .ir import DynamicShapeUnsupported, TensorRef, is_static
from .ir.index import positive_sizes
from .lowering.lower import LoweringError
from .options import DEFAULT_OPTIONS, InductorOptions
from .passes import CompileState
from .pipeline import choose_backend, stages_for, verify_state
from .size_buckets import bucket_sizes
from .size_guards import GuardWatch, shape_env_of
from .tiered import tier_up


def load_wrapper(source: str, files_dir: str, filename: str, precompiled: bool = False) -> Any:
    """Execute wrapper source as a module namespace and return its ``call_owned`` (which empties the
    list it is given: pass a list of your own). ``precompiled``: its Triton kernels (and their
    launchers) are compiling in the worker pool already, so the module's own precompile on load
    (``kiln.runtime.triton_compile.precompile``, for wrappers loaded elsewhere) is told to skip them
    through a module global:
    it would compile the same kernels again, here."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict[str, Any] = {"FILES_DIR": files_dir, "FILES": {}, "__name__": filename,
                          "_KILN_COMPILED_AHEAD": precompiled}
    exec(compile(source, filename, "exec"), ns)
    return ns["call_owned"]


class _Call:
    """A compiled graph: ``fn(*args)``, or ``fn.call_owned(list)`` for callers that hand their
    references over (kiln.autograd's backward: saved activations are freed after their last use)."""

    __slots__ = ("call",)

    def __init__(self, call: Any) -> None:
        self.call = call

    def __call__(self, *args: Any) -> tuple:
        return self.call(list(args))  # type: ignore[no-any-return]

    def call_owned(self, args: list) -> tuple:
        return self.call(args)  # type: ignore[no-any-return]


class _FirstCallWaits:
    """The compiled graph whose Triton kernels compile in worker processes: its first call waits for
    them (each first launch then loads its binary from triton's cache instead of compiling it)."""

    __slots__ = ("call", "pending")

    def __init__(self, call: Any, pending: Any) -> None:
        self.call, self.pending = call, pending

    def __call__(self, *args: Any) -> tuple:
        return self.call_owned(list(args))

    def call_owned(self, args: list) -> tuple:
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
        return self.call(args)  # type: ignore[no-any-return]


def is_static_all(xs: Sequence[Any]) -> bool:
    return all(is_static(x) for x in xs)


def _nothing() -> None:
    return None


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput], *,
                  options: InductorOptions = DEFAULT_OPTIONS, name: str = "graph") -> CompiledGraph:
    """Compile a functional ATen graph into C++/OpenMP kernels plus a Python wrapper.

    ``fn(*args)`` of the result returns a tuple; ``texts`` holds ir_pre_fusion, ir_post_fusion and
    output_code; ``portable`` is the wrapper source plus the shared library and its C++ source.

    Symbolic sizes: placeholders whose FakeTensors have SymInt sizes (one ShapeEnv; SymInt placeholders
    for symbolic ints) compile once for every size. ``size_sources`` maps each size symbol to where the
    wrapper reads it; ``size_guards`` lists the relations the compile assumed (Python over the symbols,
    checked per call: kiln.runtime.GuardError). ``DynamicShapeUnsupported``: compile static sizes instead.
    """
    with positive_sizes(shape_env_of(example_inputs)):
        return _compile_graph(gm, example_inputs, options, name)


def _compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: InductorOptions,
                   name: str) -> CompiledGraph:
    t0 = time.perf_counter()
    lifted, constants = lift_constants(gm)
    inputs = [*example_inputs, *constants]
    if options.wrapper == "cpp":
        in_cpp = _cpp_wrapper(lifted, inputs, options, name)
        if in_cpp is not None:
            return _bind_constants(in_cpp, constants, name) if constants else in_cpp
        options = options.replace(wrapper="python")
    tiered = options.wrapper == "tiered"
    if tiered:
        options = options.replace(wrapper="python")
    backend = choose_backend(inputs, options, lifted)  # once: it picks the stage list (pipeline.py)
    if isinstance(backend, TritonBackend) and backend.device == "cuda":
        warm_compile_pool("cuda")  # workers import while this graph is lowered
    try:
        compiled = _compile(lifted, inputs, backend, options, name, t0)
    except LoweringError as e:
        if shape_env_of(example_inputs) is not None:  # symbolic: a static compile can do better than ATen
            raise DynamicShapeUnsupported(f"graph {name!r} with symbolic sizes cannot be lowered: {e}") from e
        if not options.fallback_unknown_ops:
            raise
        return _eager_graph(gm, name, str(e))
    if tiered and compiled.portable is not None:
        compiled = tier_up(compiled, lifted, inputs, options, name)
    if constants:
        compiled = _bind_constants(compiled, constants, name)
    return compiled


def _cpp_wrapper(gm: fx.GraphModule, inputs: Sequence[Any], options: InductorOptions,
                 name: str) -> CompiledGraph | None:
    """The graph behind the C++ wrapper (cpp_graph.py), or None when it cannot be (said in perf_hints:
    the Python wrapper runs it)."""
    try:
        return compile_cpp_graph(gm, inputs, options=options, name=name)
    except (CppWrapperUnsupported, LoweringError, KernelBuildError, PackageError) as e:
        log("perf_hints").warning("graph %r keeps the Python wrapper (options wrapper='cpp'): %s", name, e)
        return None


def _bind_constants(compiled: CompiledGraph, constants: list[torch.Tensor], name: str) -> CompiledGraph:
    """The compiled graph with its lifted constants appended to every call; its saved program loads them."""
    portable, later, inner = compiled.portable, None, compiled.later
    if portable is not None:
        try:
            epilogue, files = constants_epilogue(constants)
            portable = replace(portable, source=portable.source + epilogue, files={**portable.files, **files})
        except (ValueError, RuntimeError) as e:  # the graph still runs; only saving it is refused
            log("perf_hints").warning("graph %s cannot be saved: %s", name, e)
            portable = None
    if portable is not None and inner is not None:
        def later(callback: Callable[[PortableProgram], None]) -> None:
            inner(lambda p: callback(replace(p, source=p.source + epilogue, files={**p.files, **files})))
    # improves=False: bound to this graph's tensors, not shared with another graph's cache hit
    return replace(compiled, fn=WithConstants(compiled.fn, constants), portable=portable, later=later,
                   improves=False)


def _eager_graph(gm: fx.GraphModule, name: str, reason: str) -> CompiledGraph:
    """The whole graph runs op by op through ATen: loudly, in perf_hints and the result's texts."""
    msg = f"graph {name!r} is not compiled, it runs op by op through ATen: {reason}"
    log("perf_hints").warning(msg)
    emit(GraphRunEagerly(name, msg))

    def fn(*args: Any) -> tuple:
        out = gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return CompiledGraph(fn, "inductor(eager fallback)", {"fallbacks": msg}, None)


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any], backend: CppBackend | TritonBackend,
             options: InductorOptions, name: str, t0: float) -> CompiledGraph:
    watch = GuardWatch(example_inputs)
    state = CompileState(gm, tuple(example_inputs), options, name, backend,
                         guards=watch if watch.symbolic else None)
    verify = options.verify if options.verify is not None else GRAPH_KNOBS.verify
    instruments = [VerifyAfterPass(verify_state)] if verify else []
    result = run_pipeline(stages_for(backend), state, None, instruments)
    s = result.value
    assert s.kernels is not None and s.program is not None
    graph_id = new_graph_id(name)
    for r in result.records:
        emit(StageTime("inductor", r.seconds, step=r.name, graph=graph_id))
    filename = f"<kiln-inductor {graph_id}>"
    pending = s.kernels.pending
    call = load_wrapper(s.wrapper, s.kernels.local_dir, filename, precompiled=pending is not None)
    fn: Callable[..., Any] = _FirstCallWaits(call, pending) if pending is not None else _Call(call)
    if options.cudagraph_sizes:
        fn = bucket_sizes(s.program, fn, options.cudagraph_sizes, name)

    texts = dict(s.texts)
    texts["timings"] = result.timings() + f"\ntotal {1e3 * (time.perf_counter() - t0):.1f} ms"
    if s.fallbacks:
        texts["fallbacks"] = "\n".join(s.fallbacks)
    if keeping_texts() and s.scheduled is not None:  # one line per kernel or extern call, in launch order
        texts["kernels"] = "\n".join(step.work.as_text().splitlines()[0] for step in s.scheduled.steps)
    for stage, text in texts.items():
        dump(graph_id, stage, text)
    # every wrapper imports its constant helpers from kiln.runtime (codegen/wrapper.py REQUIRES)
    requires = tuple(dict.fromkeys((*s.kernels.requires, *REQUIRES)))
    portable = PortableProgram(s.wrapper, dict(s.kernels.files), requires, s.kernels.triton_modules)
    # the strides each output really has (None: not a tensor); they differ from the trace only for
    # outputs marked layout-free (GraphAnnotations.layout_free_outputs), e.g. channels-last saved activations;
    # symbolic strides: None (the caller keeps the traced ones)
    output_strides = tuple(
        tuple(int(st) for st in o.stride) if isinstance(o, TensorRef) and is_static_all(o.stride) else None
        for o in s.program.outputs)
    return CompiledGraph(fn, "inductor", texts, portable, output_strides=output_strides,
                         # blocks until the Triton kernels compiling in the worker pool are done
                         wait_kernels=pending.wait if pending is not None else _nothing,
                         loop_program=s.program, scheduled=s.scheduled,
                         size_guards=tuple(str(g.expr) for g in s.program.size_guards),
                         size_sources={str(z.symbol): z.source for z in s.program.sizes})
