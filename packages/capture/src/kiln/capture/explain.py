"""``explain(fn)(*args)``: every graph, break and guard one call produces; and ``capture_graph``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.graph import CapturedGraph, GuardSet

from .capture import run_capture
from .errors import Unsupported
from .knobs import CaptureOptions
from .optimize import CompileContext, Optimized
from .pipeline import needs_backend


@dataclass
class BreakReason:
    reason: str
    user_stack: list[str]

    def as_text(self) -> str:
        return f"{self.reason}\n" + "\n".join(f"    {s}" for s in self.user_stack)


@dataclass
class EagerFrame:
    """A frame that ran in Python without a graph, and why."""

    function: str  # name (file:line)
    reason: str

    def as_text(self) -> str:
        return f"{self.function} ran eagerly: {self.reason}"


@dataclass(repr=False)
class ExplainOutput:
    graphs: list[CapturedGraph] = field(default_factory=list)
    break_reasons: list[BreakReason] = field(default_factory=list)
    op_count: int = 0
    guards: list[GuardSet] = field(default_factory=list)
    result: Any = None
    eager_frames: list[EagerFrame] = field(default_factory=list)

    def __repr__(self) -> str:  # a summary; as_text() prints the graphs and guards in full
        lines = [f"ExplainOutput: {self.graph_count} graph(s), {self.break_count} graph break(s), "
                 f"{self.op_count} op(s), {sum(len(g) for g in self.guards)} guard(s)"]
        lines += [f"  break {i + 1}: {b.reason} at {b.user_stack[0] if b.user_stack else '?'}"
                  for i, b in enumerate(self.break_reasons)]
        lines += [f"  {e.as_text()}" for e in self.eager_frames]
        return "\n".join(lines)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.break_reasons)

    def as_text(self) -> str:
        parts = [f"Graph count: {self.graph_count}", f"Graph break count: {self.break_count}",
                 f"Op count: {self.op_count}"]
        if self.eager_frames:
            parts.append("Frames run eagerly (no graph):")
            parts += [f"  {e.as_text()}" for e in self.eager_frames]
        if self.break_reasons:
            parts.append("Break reasons:")
            parts += [f"  {i + 1}. {b.as_text()}" for i, b in enumerate(self.break_reasons)]
        for i, g in enumerate(self.graphs):
            parts.append(f"---- graph {i} ----\n{g.as_text()}")
        return "\n".join(parts)


def _eager_backend(gm: Any, example_inputs: list) -> Callable:
    return gm.forward


def explain(fn: Callable, *, dynamic: bool | None = None) -> Callable[..., ExplainOutput]:
    """A callable running ``fn`` once under capture and reporting what was captured (``dynamic`` as in
    ``optimize``: symbolic sizes print as ``SYMBOL``/``SHAPE_EXPR`` guards)."""
    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        out = ExplainOutput()
        ctx = CompileContext(_eager_backend, CaptureOptions(dynamic=dynamic))
        ctx.observed = False  # a dry run: kiln.stats() and the compile report count real compiles

        def record(cap: Any, cache: Any) -> None:
            if needs_backend(cap):
                out.graphs.append(cap.captured)
                out.guards.append(cap.captured.guards)
            out.op_count += cap.op_count
            if cap.break_plan is not None:
                out.break_reasons.append(BreakReason(cap.break_plan.reason, cap.break_plan.user_stack))
        ctx.on_capture.append(record)
        ctx.on_eager.append(lambda function, reason: out.eager_frames.append(EagerFrame(function, reason)))
        out.result = Optimized(fn, ctx)(*args, **kwargs)
        return out
    return run


def capture_graph(fn: Callable, args: tuple | list, kwargs: dict | None = None, *,
                  dynamic: bool | None = None) -> CapturedGraph:
    """One whole-graph capture without a backend (for ahead-of-time compilation). Dims marked with
    ``mark_dynamic`` (every dim with ``dynamic=True``) are symbolic; a backend compiling the graph
    afterwards may add shape guards: take them with ``refresh_shape_guards``."""
    ctx = CompileContext(_eager_backend, CaptureOptions(fullgraph=True, dynamic=dynamic))
    opt = Optimized(fn, ctx)
    if opt.code is None:
        raise Unsupported(f"capture_graph needs a Python function, method or module; got {fn!r}")
    L = opt.bind(tuple(args), dict(kwargs or {}))
    cache = ctx.cache_for(opt.code)
    try:
        cap = run_capture(opt.code, opt.f_globals, opt.closure, L, ctx.options, cache.dynamic_policy(ctx.options),
                          cache.may_be_dynamic(L, ctx.options))
    except Exception:
        floats = {f"L[{n!r}]" for n, v in L.items() if type(v) is float}
        if dynamic is not True or not floats:
            raise
        # dynamic=True made the float arguments symbolic and one met an operation with no graph form
        # (``round(s * 100)``): they are constants of the capture, as kiln.compile does (optimize.py)
        cache.static_floats |= floats
        cap = run_capture(opt.code, opt.f_globals, opt.closure, L, ctx.options, cache.dynamic_policy(ctx.options),
                          cache.may_be_dynamic(L, ctx.options))
    return cap.captured
