"""One capture: interpret a frame on fake tensors and package the graph, guards and the plan for
what happens after the graph (return a value, or run the breaking instruction and resume)."""

from __future__ import annotations

import dataclasses
import inspect
import operator
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from kiln.graph import CapturedGraph, GraphAnnotations, GuardSet, TensorSpec, annotate, shape_env_of

from .aliasing import AliasPlan
from .deferred import CALL, EXIT_CALL
from .errors import GraphBreak, SkipFrame, Unsupported
from .frame import BreakAt, Context, Frame, FrameResult
from .generators import refuse_dropped_cleanup
from .knobs import KNOBS, CaptureOptions
from .module_init import BuiltModuleEscapes
from .numpy_random import flush_pending
from .rebuild import Flattener, Plan
from .shape_guards import STRIDE_NOTE, shape_guards
from .sources import local_source
from .tracer import DELETED, DynamicPolicy, Tracer
from .values import EMPTY, NULL, AutocastContext, Cell, ContextExit


@dataclass
class BreakPlan:
    """What runs in Python after the graph when the frame broke at ``inst``."""

    inst: Any
    stack_plans: list[Plan | None]  # None marks a NULL slot
    local_names: list[str]
    local_plans: list[Plan]
    kw_names: tuple | None
    reason: str
    user_stack: list[str]


@dataclass
class Capture:
    captured: CapturedGraph
    example_inputs: list[Any]
    input_sources: list[str]
    result_plan: Plan | None  # the return value when the frame returned
    break_plan: BreakPlan | None
    op_count: int
    side_effects: list[tuple[Plan, str, Plan | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pinned: list[Any] = field(default_factory=list)  # objects of ID_MATCH guards, alive with the entry
    pinned_tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # their layouts checked
    call_paths: tuple = ()  # module calls traced (module_calls.call_path_check)
    global_hooks: tuple | None = None  # the global module hooks when a module call was traced
    aliasing: AliasPlan | None = None  # how the input tensors must alias on each call (aliasing.py)


def run_capture(code: types.CodeType, f_globals: dict[str, Any], closure: tuple | None,
                L: dict[str, Any], options: CaptureOptions, policy: DynamicPolicy,
                symbolic: bool = True, unspecialized: frozenset[str] = frozenset()) -> Capture:
    escaping: frozenset = frozenset()
    while True:
        try:
            return _capture_once(code, f_globals, closure, L, options, policy, symbolic, unspecialized, escaping)
        except BuiltModuleEscapes as e:
            # a torch.nn module built in the graph outlives it: capture again, building that one in
            # Python (module_init.py); each attempt adds a site, so this ends
            if e.site in escaping:
                raise SkipFrame(f"{e} and kiln could not move its construction out of the graph") from e
            escaping = escaping | {e.site}


def _capture_once(code: types.CodeType, f_globals: dict[str, Any], closure: tuple | None,
                  L: dict[str, Any], options: CaptureOptions, policy: DynamicPolicy, symbolic: bool,
                  unspecialized: frozenset[str], escaping: frozenset) -> Capture:
    tracer = Tracer(policy, symbolic, duck=options.dynamic is True, unspecialized=unspecialized)
    ctx = Context(tracer, options, KNOBS.inline_depth, code, escaping_builds=escaping)
    grad_before = torch.is_grad_enabled()
    try:
        locals_ = {}
        packed = _packed_arg_names(code)
        for name, value in L.items():
            if name == "__closure__":
                continue
            locals_[name] = tracer.wrap(value, local_source(name))
            if name in packed:  # *args / **kwargs are fresh per call: the frame owns them
                tracer.source_of.pop(id(locals_[name]), None)
        cells = tuple(Cell(real=c, source=f"L['__closure__'][{i}].cell_contents")
                      for i, c in enumerate(closure or ()))
        frame = Frame(ctx, code, f_globals, locals_, cells, parent=None)
        outcome = frame.run_top()
        refuse_dropped_cleanup(ctx.generators)
        if isinstance(outcome, BreakAt) and options.fullgraph:
            raise Unsupported(_unsupported_message(outcome))
        return _package(tracer, frame, outcome, grad_before)
    finally:
        torch._C._set_grad_enabled(grad_before)
        for block in reversed(ctx.open_autocasts):  # stopped inside `with torch.autocast(...)`
            block.__exit__(None, None, None)


def _packed_arg_names(code: types.CodeType) -> set[str]:
    idx = code.co_argcount + code.co_kwonlyargcount
    out = set()
    if code.co_flags & inspect.CO_VARARGS:
        out.add(code.co_varnames[idx])
        idx += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        out.add(code.co_varnames[idx])
    return out


def _unsupported_message(b: BreakAt) -> str:
    where = b.user_stack[0] if b.user_stack else "?"
    stack = "\n".join(f"  {s}" for s in b.user_stack)
    return (f"kiln.capture cannot put this in one graph: {b.reason}\n  at {where}\n"
            f"user stack (innermost first):\n{stack}\n"
            "hint: remove fullgraph=True to allow a graph break here, or rewrite the construct")


def _enables_grad_over_grad_inputs(tracer: Tracer) -> bool:
    nodes = tracer.root_graph.nodes
    enables = any(n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args[0] is True
                  for n in nodes)
    return enables and any(n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
                           and n.meta["val"].requires_grad for n in nodes)


def _package(tracer: Tracer, frame: Frame, outcome: FrameResult | BreakAt, grad_before: bool) -> Capture:
    tracer.write_back_device_copies()  # NumPy arrays moved to a torch.device context's device
    flat = Flattener(tracer)
    result_plan: Plan | None = None
    break_plan: BreakPlan | None = None
    if isinstance(outcome, BreakAt):
        _close_autocast_blocks(tracer, outcome.stack, frame.ctx.open_autocasts)
    for node, _ in reversed(tracer.resumed_autocasts):  # the states entered where resumed blocks ended
        tracer.root_graph.call_function(torch.amp.autocast_mode._exit_autocast, (node,))
    if isinstance(outcome, BreakAt):
        stack_plans = [None if v is NULL else flat.plan(v) for v in outcome.stack]
        names = [n for n, v in outcome.locals.items() if v is not NULL and not n.startswith("__kiln_stack")]
        cell_names = [n for n, c in outcome.cells.items() if c.real is None and n not in outcome.locals
                      and n in frame.code.co_cellvars and c.value is not EMPTY]
        local_plans = [flat.plan(outcome.locals[n]) for n in names] + \
                      [flat.plan(outcome.cells[n].value) for n in cell_names]
        break_plan = BreakPlan(outcome.inst, stack_plans, names + cell_names, local_plans,
                               outcome.kw_names, outcome.reason, outcome.user_stack)
    else:
        result_plan = flat.plan(outcome.value)
    side_effects = [(flat.plan(obj), name, None if value is DELETED else flat.plan(value))
                    for obj, name, value in tracer.attr_writes.values()]
    for copy, src in tracer.container_writes.values():
        getter = eval(f"lambda outs, L, G: {src}")  # noqa: S307 (a guard source we generated)
        side_effects.append((getter, CONTENTS, _contents_plan(flat, copy)))
    for fn, args, kwargs in [*tracer.deferred, *flush_pending(tracer)]:  # print, logging, warnings,
        # manual_seed (deferred.py); NumPy seeds no draw of this graph followed (numpy_random.py)
        side_effects.append((flat.plan(fn), CALL, flat.plan((list(args), dict(kwargs)))))
    # Note: grad-mode changes stay in effect after the graph, as in eager: the mode the trace ends in is
    # set after the graph (the graph's own _set_grad_enabled nodes only act inside the backend's trace);
    # a break inside a grad-mode block re-enters a real context object for the resume function (rebuild.py)
    grad_after = torch.is_grad_enabled()
    if not grad_before and _enables_grad_over_grad_inputs(tracer):
        # kiln.autograd picks the inference path for a graph entered with grad off, so outputs computed
        # after the graph turns grad on would carry requires_grad without a grad_fn: run it in Python
        raise SkipFrame("the frame is entered with grad disabled and enables it (e.g. the resumed end of a "
                        "torch.no_grad block) over inputs that require grad; it runs in Python")
    if grad_after != grad_before:
        side_effects.append((_SET_GRAD, CALL, lambda outs, L, G: ([grad_after], {})))
    for _, src in tracer.resumed_autocasts:  # blocks entered before a break, left in this graph
        side_effects.append((eval(f"lambda outs, L, G: {src}"), EXIT_CALL,  # noqa: S307 (a source we made)
                             lambda outs, L, G: ([None, None, None], {})))
    aliasing = tracer.input_tensors.plan()  # raises GraphBreak for written overlapping inputs
    out_nodes = tuple(tracer.to_arg(v) for v in flat.outputs)
    tracer.graph.output(out_nodes)
    _dead_code(tracer)
    root = torch.nn.Module()
    for name, sub in tracer.submodules.items():  # torch.cond branches (cond.py)
        root.add_module(name, sub)
    gm = fx.GraphModule(root, tracer.graph, class_name="KilnCaptured")
    _annotate(gm)
    gs = _guard_set(list(tracer.guards.values()) + tracer.stride_relations, tracer.shape_env,
                    tracer.symbol_sources)
    specs: list[TensorSpec | int | None] = [TensorSpec.from_tensor(i.fake) if isinstance(i.fake, torch.Tensor)
                                            else None for i in tracer.inputs]
    captured = CapturedGraph(gm, tuple(i.source for i in tracer.inputs), tuple(specs), gs)
    op_count = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method")
                   and n.target is not operator.getitem and n.target != "size")
    return Capture(captured, [i.value for i in tracer.inputs], [i.source for i in tracer.inputs],
                   result_plan, break_plan, op_count, side_effects, pinned=tracer.pinned,
                   pinned_tensors=tracer.pinned_tensors,
                   call_paths=tuple(tracer.call_paths.values()), global_hooks=tracer.global_hooks,
                   aliasing=aliasing)




def _annotate(gm: fx.GraphModule) -> None:
    """What later stages need to know of the graph's inputs (kiln.graph's GraphAnnotations)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    annotate(gm, GraphAnnotations(
        input_sources=tuple(str(n.meta.get("source", "")) for n in placeholders),
        module_state=tuple(i for i, n in enumerate(placeholders) if n.meta.get("module_state"))))


def _guard_set(guards: list, shape_env: Any, symbol_sources: dict[str, list[str]]) -> GuardSet:
    return GuardSet(tuple(_order_guards(guards + shape_guards(shape_env, symbol_sources)))).simplified()


def refresh_shape_guards(captured: CapturedGraph) -> CapturedGraph:
    """``captured`` with its shape guards taken again from its ShapeEnv.

    Note: the ShapeEnv of a symbolic capture is shared with the backend (kiln.autograd traces with it,
    a compiler may specialise a size), so assumptions made *after* capture are guards too: the
    entry's guards are built from the ShapeEnv once the backend returned (torch's compiler does the
    same). A static capture comes back unchanged."""
    vals = [n.meta.get("val") for n in captured.gm.graph.nodes if n.op == "placeholder"]
    env = shape_env_of(vals)
    if env is None:
        return captured
    symbols: dict[str, list[str]] = {}
    for g in captured.guards:
        if g.kind == "SYMBOL":
            symbols.setdefault(str(g.expected), []).append(g.source)
    rest = [g for g in captured.guards
            if g.kind not in ("SYMBOL", "SHAPE_EXPR") or g.kind == "SHAPE_EXPR" and g.note == STRIDE_NOTE]
    return dataclasses.replace(captured, guards=_guard_set(rest, env, symbols))


def _SET_GRAD(outs: Any, L: dict, G: dict) -> Any:  # noqa: N802 (a plan: the function to call)
    return torch._C._set_grad_enabled


def _close_autocast_blocks(tracer: Tracer, stack: list, open_autocasts: list) -> None:
    """A break inside ``torch.autocast``: the graph leaves the block (innermost first) and so does
    the real state the trace entered (taken off ``open_autocasts``, which the capture's cleanup exits:
    exited twice, torch's autocast nesting count went to -1, so its cast cache was never cleared again
    and later autocast code, eager included, computed with stale casts of updated weights); the rebuild
    plan enters it again for the resume function."""
    for v in reversed(stack):
        if isinstance(v, ContextExit) and isinstance(v.ctx, AutocastContext) and v.ctx.node is not None:
            tracer.root_graph.call_function(torch.amp.autocast_mode._exit_autocast, (v.ctx.node,))
            v.ctx.real.__exit__(None, None, None)
            if v.ctx.real in open_autocasts:
                open_autocasts.remove(v.ctx.real)
            v.ctx.node = None


CONTENTS = "[:]"  # a side effect that writes a container's whole contents back


def _contents_plan(flat: Flattener, copy: Any) -> Plan:
    """The items of a traced copy of an input list/dict, built from graph outputs (not its source)."""
    if isinstance(copy, list):
        parts = [flat.plan(x) for x in copy]
        return lambda outs, L, G: [p(outs, L, G) for p in parts]
    keys = list(copy.keys())
    vals = [flat.plan(copy[k]) for k in keys]
    return lambda outs, L, G: dict(zip(keys, [p(outs, L, G) for p in vals]))


def _dead_code(tracer: Tracer) -> None:
    changed = True
    while changed:
        changed = False
        for node in reversed(list(tracer.graph.nodes)):
            if node in tracer.speculative and not node.users:
                tracer.graph.erase_node(node)
                tracer.speculative.discard(node)
                changed = True


_ORDER = {"GLOBAL_STATE": 0, "ID_MATCH": 1, "TYPE_MATCH": 2, "IS_NONE": 3, "NOT_NONE": 3,
          "LENGTH_MATCH": 4, "DICT_KEYS": 4, "EQUALS_MATCH": 5, "TENSOR_MATCH": 6, "SYMBOL": 7,
          "SHAPE_EXPR": 8}


def _order_guards(guards: list) -> list:
    """Cheap guards first, and each source's type before anything reading through it."""
    def key(g: Any) -> tuple:
        if g.kind == "GLOBAL_STATE":
            return (0, 0, 0)
        if g.kind in ("SYMBOL", "SHAPE_EXPR"):
            return (2 if g.kind == "SYMBOL" else 3, 0, 0)
        return (1, g.source.count("[") + g.source.count("."), _ORDER[g.kind])
    return sorted(guards, key=key)


__all__ = ["Capture", "GraphBreak", "refresh_shape_guards", "run_capture"]
