"""``decompose(gm, table)`` and ``trace(fn, args, table)``: re-trace through the dispatcher.

The source graph is interpreted node by node on fake tensors. An ATen node is handed to the recorder
(decomposed if the table has it, recorded otherwise); any other node (``torch.*`` functions, tensor
methods, ``operator.*`` of a torch-dialect graph) is run under the recorder, so whatever ATen calls it
makes are recorded: ``decompose`` therefore also lowers a torch-dialect graph to ATen.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import fx
from torch._ops import HigherOrderOperator, OpOverload
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln.graph import (
    CORE_ATEN_OPS,
    KNOBS,
    Dialect,
    annotations_of,
    autocast_off,
    lazy_graph_module,
    log,
    map_leaves,
    shape_env_of,
    symbolic_dispatch,
    target_name,
)
from kiln.graph import verify as verify_dialect

from .tracer import CARRIED_META, DecompositionError, GraphRecorder

Table = Mapping[OpOverload, Callable[..., Any]]



def normalize_args(op: OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments as the dispatcher passes them: positional ones by position, kwarg-only by name."""
    pos: list[Any] = []
    kw: dict[str, Any] = {}
    args = list(args)
    for i, a in enumerate(op._schema.arguments):
        if a.kwarg_only:
            if a.name in kwargs:
                kw[a.name] = kwargs[a.name]
            continue
        if i < len(args):
            pos.append(args[i])
        elif a.name in kwargs:
            pos.append(kwargs[a.name])
        elif a.has_default_value():
            pos.append(a.default_value)
        else:
            raise DecompositionError(f"{op} is missing its argument {a.name!r}")
    # trailing defaults the caller did not give are dropped, as the dispatcher does
    while len(pos) > len(args) and pos and op._schema.arguments[len(pos) - 1].has_default_value() \
            and op._schema.arguments[len(pos) - 1].name not in kwargs:
        pos.pop()
    return tuple(pos), kw


def _fake_mode_of(values: Sequence[Any]) -> FakeTensorMode | None:
    """The fake mode of the values' fake tensors (symbolic sizes among them share its ShapeEnv)."""
    for v in tree_flatten(list(values))[0]:
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return None


def _fakes_for(gm: fx.GraphModule, example_inputs: Sequence[Any] | None) -> tuple[list[Any], FakeTensorMode]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is None:
        missing = [n.name for n in placeholders if "val" not in n.meta]
        if missing:
            raise DecompositionError(
                f"placeholders {missing} have no meta['val']; pass example_inputs=[...] to decompose()")
        vals = [n.meta["val"] for n in placeholders]
    else:
        if len(example_inputs) != len(placeholders):
            raise DecompositionError(
                f"the graph has {len(placeholders)} inputs but {len(example_inputs)} example inputs were given")
        vals = list(example_inputs)
    mode = _fake_mode_of(vals)
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=False)
    fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor) else v
             for v in vals]
    return fakes, mode


class _Retracer(fx.Interpreter):
    """Runs the source graph's nodes through a GraphRecorder, carrying their meta to new nodes.

    ``reuse``: a node the table does not decompose, whose inputs' values have the metadata its
    source inputs had, is recorded with the source node's own fake value instead of running it on
    fake tensors again (the run would compute the same metadata): only the decomposed nodes, and
    whatever their new values change downstream, run. Fake dispatch is most of a re-trace's cost.
    """

    def __init__(self, gm: fx.GraphModule, recorder: GraphRecorder, reuse: bool = False) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.recorder = recorder
        self.reuse = reuse
        self._node: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self._node = n
        self.recorder.carried_meta = {k: n.meta[k] for k in CARRIED_META if k in n.meta}
        try:
            return super().run_node(n)
        except DecompositionError:
            raise
        except Exception as e:
            raise DecompositionError(f"re-tracing node %{n.name} ({n.format_node()}) failed: "
                                     f"{type(e).__name__}: {e}") from e

    def placeholder(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().placeholder(target, args, kwargs)
        source = self._node
        assert source is not None  # (run_node set it)
        node = self.recorder.graph.placeholder(source.name)
        node.meta.update(source.meta)
        node.meta["val"] = value
        self.recorder.bind(value, node)
        return value

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return self.recorder.constant(value)[0]
        raise DecompositionError(f"get_attr {target!r} is a {type(value).__name__}; only tensors are supported")

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(target, HigherOrderOperator):
            raise DecompositionError(f"higher-order operator {target.__name__} is not supported by decompose()")
        if isinstance(target, OpOverload):
            args, kwargs = map_leaves(self.recorder.to_fake, (args, kwargs))
            pos, kw = normalize_args(target, args, kwargs)
            if self.reuse and target not in self.recorder.table:
                traced = self._traced_value(target)
                if traced is not None:
                    return self.recorder.emit(target, pos, kw, traced)
            with autocast_off():
                return self.recorder.dispatch(target, pos, kw)
        with self.recorder:
            return target(*args, **kwargs)

    def _traced_value(self, target: OpOverload) -> Any:
        """The source node's fake value when running ``target`` again would give the same: it has
        one (of this trace's fake mode) and every input's value now matches what it was traced with
        (the same tensor, or for non-aliasing ops one with equal metadata)."""
        n = self._node
        assert n is not None
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        mode = self.recorder.fake_mode
        if not vals or not all(isinstance(v, FakeTensor) and v.fake_mode is mode for v in vals):
            return None
        aliasing = any(r.alias_info is not None for r in target._schema.returns)
        for a in n.all_input_nodes:
            now, was = self.env[a], a.meta.get("val")
            if now is was:
                continue
            if aliasing or not (isinstance(now, FakeTensor) and isinstance(was, FakeTensor)) \
                    or not _same_metadata(now, was):
                return None
        return val

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        with self.recorder:
            return super().call_method(target, args, kwargs)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        with self.recorder:
            return super().call_module(target, args, kwargs)

    def output(self, target: Any, args: Any, kwargs: Any) -> Any:
        return args[0]


def _same_metadata(a: torch.Tensor, b: torch.Tensor) -> bool | torch.SymBool:
    return (a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset())


def _reusable_values(gm: fx.GraphModule, mode: FakeTensorMode) -> bool:
    """Whether the graph's own fake values may stand in for a node's re-run: static shapes (no
    symbolic size to re-bind), and placeholders whose values are the trace's fake tensors."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, FakeTensor):
            if v.fake_mode is not mode or any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
                return False
        elif not isinstance(v, int):
            return False
    return True


def _finish(graph: fx.Graph, root: torch.nn.Module, recorder: GraphRecorder, out: Any,
            out_meta: dict[str, Any]) -> fx.GraphModule:
    out_node = graph.output(recorder.output_args(out))
    out_node.meta.update(out_meta)
    out_node.meta["val"] = out
    graph.eliminate_dead_code()
    return lazy_graph_module(root, graph)  # code made if it is ever run (a GraphModule made it twice)


def decompose(gm: fx.GraphModule, table: Table, example_inputs: Sequence[Any] | None = None, *,
              check: bool | None = None) -> fx.GraphModule:
    """Re-trace ``gm`` replacing every op that ``table`` has by its decomposition, to a fixpoint.

    ``gm`` may be aten- or torch-dialect. Placeholders (names, meta) and the output structure are kept;
    every node carries ``meta['val']``. For a full table (``table.dialect`` set) the result is
    verified against the table's dialect: ``check=True`` raises naming any op still missing a
    decomposition; the default raises under ``KILN_VERIFY=1`` and otherwise logs those ops to
    ``perf_hints`` and returns the graph with them left in place (so a backend can fall back).
    """
    if example_inputs is None and (traced_with(gm, table) or _already_decomposed(gm, table)):
        result = _copy(gm)  # re-tracing would rebuild the same graph, at the cost of a fake run per node
    else:
        result = _retrace(gm, table, example_inputs)
    dialect: Dialect | None = getattr(table, "dialect", None)
    if dialect is not None and check is not False:
        _verify(result, dialect, table, strict=KNOBS.verify if check is None else True)
    return result


def traced_with(gm: fx.GraphModule, table: Table) -> bool:
    """Whether ``gm`` was traced with ``table`` applied (``GraphAnnotations.decomposed_by``: kiln.autograd
    says so of the graphs it traces with a named table): decomposition is done once, where the graph
    was traced, and not repeated by the compiler that receives it."""
    name = getattr(table, "name", "")
    return bool(name) and annotations_of(gm).decomposed_by == name


def _already_decomposed(gm: fx.GraphModule, table: Table) -> bool:
    """Whether ``decompose`` would give ``gm`` back unchanged: an ATen graph (a kiln.autograd trace
    that applied the same table) where no op has a decomposition, every node carries its fake
    value, tensors only (no size queries to fold), and nothing is dead."""
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            if n.op == "placeholder" and not isinstance(n.meta.get("val"), (FakeTensor, torch.SymInt, int)):
                return False
            continue
        if n.op != "call_function" or not n.users:
            return False
        val = n.meta.get("val")
        if n.target is operator.getitem:
            if not isinstance(val, FakeTensor):
                return False
            continue
        if not isinstance(n.target, OpOverload) or n.target in table:
            return False
        vals = val if isinstance(val, (tuple, list)) else (val,)
        if not vals or not all(isinstance(v, FakeTensor) for v in vals):
            return False
    return True


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over a copy of the graph (same names, meta shallow-copied): callers rewrite
    the result in place, as they may a re-traced one."""
    graph = fx.Graph()
    out, out_node = graph.graph_copy(gm.graph, {}, return_output_node=True)  # type: ignore[misc]
    graph.output(out).meta.update(cast(fx.Node, out_node).meta)
    result = lazy_graph_module(gm, graph)
    result.meta.update(gm.meta)
    return result


def _retrace(gm: fx.GraphModule, table: Table, example_inputs: Sequence[Any] | None) -> fx.GraphModule:
    fakes, mode = _fakes_for(gm, example_inputs)
    graph = fx.Graph()
    root = torch.nn.Module()
    recorder = GraphRecorder(graph, table, mode, root)
    interp = _Retracer(gm, recorder, reuse=example_inputs is None and _reusable_values(gm, mode))
    out_source = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    with mode, torch.no_grad(), symbolic_dispatch(shape_env_of(fakes) is not None):
        out = interp.run(*fakes)
    return _finish(graph, root, recorder, out, dict(out_source.meta))


def _in_dialect(op: OpOverload, dialect: Dialect) -> bool:
    if dialect == Dialect.PRIMS:
        return op.namespace == "kiln_prims"
    return op.namespace != "aten" or target_name(op) in CORE_ATEN_OPS


def _verify(gm: fx.GraphModule, dialect: Dialect, table: Table, strict: bool) -> None:
    try:
        verify_dialect(gm, dialect)
    except Exception as e:
        left = sorted({target_name(n.target) for n in gm.graph.nodes if n.op == "call_function"
                       and isinstance(n.target, OpOverload) and not _in_dialect(n.target, dialect)})
        msg = (f"decompose(table={getattr(table, 'name', '?')!r}) left {len(left)} op(s) outside the {dialect} "
               f"dialect ({', '.join(left[:12])}): {e}. "
               "Register a decomposition with @kiln.decomp.register(op, table=...) or grow the core set.")
        if strict:
            raise DecompositionError(msg) from e
        log("perf_hints").warning("%s (left in place)", msg)


def trace(fn: Callable[..., Any], args: Sequence[Any], table: Table | None = None,
          kwargs: Mapping[str, Any] | None = None, *, functionalize: bool = False,
          scalar_inputs: bool = False) -> fx.GraphModule:
    """Trace ``fn(*args, **kwargs)`` through the dispatcher into an ATen graph (decomposed by ``table``).

    Tensor arguments become placeholders (fake copies are made of real tensors); tensors that ``fn``
    reads from elsewhere (module parameters) become ``get_attr`` constants. Autograd runs as usual, so
    a function that calls ``torch.autograd.grad`` yields its backward ops too. With ``functionalize``,
    in-place ops on fresh unaliased tensors are recorded in functional form (others raise); full
    functionalization of views and input mutation is kiln.autograd's job. With ``scalar_inputs``,
    non-tensor arguments get placeholders too (the graph takes the same argument list; a SymInt's
    symbol is bound to its placeholder, other values are used as constants).
    """
    flat, spec = tree_flatten((list(args), dict(kwargs or {})))
    mode = _fake_mode_of(flat) or FakeTensorMode()
    graph = fx.Graph()
    root = torch.nn.Module()
    recorder = GraphRecorder(graph, table or {}, mode, root, functionalize=functionalize)
    fakes: list[Any] = []
    for i, v in enumerate(flat):
        if isinstance(v, torch.Tensor):
            fake = v if isinstance(v, FakeTensor) else mode.from_tensor(v)
            if v.requires_grad and not fake.requires_grad:
                fake.requires_grad_(True)
            node = graph.placeholder(f"arg{i}")
            node.meta["val"] = fake
            recorder.bind(fake, node)
            fakes.append(fake)
        else:
            if scalar_inputs:
                node = graph.placeholder(f"arg{i}")
                node.meta["val"] = v
                recorder.bind(v, node)
            fakes.append(v)
    fargs, fkwargs = tree_unflatten(fakes, spec)
    with mode, symbolic_dispatch(shape_env_of(fakes) is not None), recorder:
        out = fn(*fargs, **fkwargs)
    return _finish(graph, root, recorder, out, {})
