"""compile_graph: the entry point (the compile() backend contract, returning a CompiledGraph)."""

from __future__ import annotations

import linecache
import time
from collections.abc import Sequence
from typing import Any

from torch import fx

from kiln.graph import KNOBS as GRAPH_KNOBS
from kiln.graph import (
    CompiledGraph,
    PortableProgram,
    VerifyAfterPass,
    dump,
    log,
    new_graph_id,
    run_pipeline,
)

from .ir import TensorRef
from .lowering.lower import LoweringError
from .options import DEFAULT_OPTIONS, InductorOptions
from .pipeline import PASSES, CompileState, verify_state


def load_wrapper(source: str, files_dir: str, filename: str) -> Any:
    """Execute wrapper source as a module namespace and return its ``call_owned`` (which empties the
    list it is given: pass a list of your own)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict[str, Any] = {"FILES_DIR": files_dir, "FILES": {}, "__name__": filename}
    exec(compile(source, filename, "exec"), ns)
    return ns["call_owned"]


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: InductorOptions = DEFAULT_OPTIONS, name: str = "graph") -> CompiledGraph:
    """Compile a functional ATen graph into C++/OpenMP kernels plus a Python wrapper.

    ``fn(*args)`` of the result returns a tuple; ``texts`` holds ir_pre_fusion, ir_post_fusion and
    output_code; ``portable`` is the wrapper source plus the shared library and its C++ source.
    """
    t0 = time.perf_counter()
    try:
        return _compile(gm, example_inputs, options, name, t0)
    except LoweringError as e:
        if not options.fallback_unknown_ops:
            raise
        return _eager_graph(gm, name, str(e))


def _eager_graph(gm: fx.GraphModule, name: str, reason: str) -> CompiledGraph:
    """The whole graph runs op by op through ATen: loudly, in perf_hints and the result's texts."""
    msg = f"graph {name!r} is not compiled, it runs op by op through ATen: {reason}"
    log("perf_hints").warning(msg)

    def fn(*args: Any) -> tuple:
        out = gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return CompiledGraph(fn, "inductor(eager fallback)", {"fallbacks": msg}, None)


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any], options: InductorOptions, name: str,
             t0: float) -> CompiledGraph:
    state = CompileState(gm, list(example_inputs), options, name)
    verify = options.verify if options.verify is not None else GRAPH_KNOBS.verify
    instruments = [VerifyAfterPass(verify_state)] if verify else []
    result = run_pipeline(PASSES, state, None, instruments)
    s = result.value
    assert s.kernels is not None and s.program is not None
    graph_id = new_graph_id(name)
    filename = f"<kiln-inductor {graph_id}>"
    call = load_wrapper(s.wrapper, s.kernels.local_dir, filename)

    def fn(*args: Any) -> tuple:
        return call(list(args))  # type: ignore[no-any-return]
    # callers that can hand their references over (kiln.autograd's backward: saved activations)
    fn.call_owned = call  # type: ignore[attr-defined]

    texts = dict(s.texts)
    texts["timings"] = result.timings() + f"\ntotal {1e3 * (time.perf_counter() - t0):.1f} ms"
    if s.fallbacks:
        texts["fallbacks"] = "\n".join(s.fallbacks)
    for stage, text in texts.items():
        dump(graph_id, stage, text)
    portable = PortableProgram(s.wrapper, dict(s.kernels.files), tuple(s.kernels.requires))
    compiled = CompiledGraph(fn, "inductor", texts, portable)
    compiled.loop_program = s.program  # type: ignore[attr-defined]
    compiled.scheduled = s.scheduled  # type: ignore[attr-defined]
    # the strides each output really has (None: not a tensor); they differ from the trace only for
    # outputs marked layout-free (layout.FREE_OUTPUTS), e.g. channels-last saved activations
    compiled.output_strides = tuple(  # type: ignore[attr-defined]
        tuple(int(st) for st in o.stride) if isinstance(o, TensorRef) else None for o in s.program.outputs)
    return compiled
