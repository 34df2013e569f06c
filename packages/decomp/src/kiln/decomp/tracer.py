"""A dispatcher-level re-tracer: run code on fake tensors and record every ATen call into an fx.Graph.

Note: this is kiln's own tracer, not torch's. ``GraphRecorder`` is a ``TorchDispatchMode`` stacked
on a ``FakeTensorMode``: each ATen call that reaches it is either replaced by its decomposition from
the table (run under the recorder again, so the ops it calls are decomposed too: recursion reaches the
fixpoint) or computed on fake tensors and recorded as a node whose ``meta['val']`` is the fake result.
Tensors are tied to nodes by identity; symbolic sizes are rebuilt from the symbols bound to inputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import sympy
import torch
from torch import fx
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from kiln.graph import SIZE_OPS, SIZE_UNARY_OPS, KilnError, map_leaves

from .registry import op_name

MAX_DEPTH = 200  # nested decompositions deeper than this are a rule that calls itself
# Node meta copied from a source node to every node recorded while re-tracing it.
CARRIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "seq_nr", "from_node",
                "original_aten", "partitioner_tag", "recompute", "custom")


# In-place ops whose functional form has another overload name.
_FUNCTIONAL_FORMS: dict[OpOverload, OpOverload] = {
    torch.ops.aten.bernoulli_.float: torch.ops.aten.bernoulli.p,
    torch.ops.aten.bernoulli_.Tensor: torch.ops.aten.bernoulli.Tensor,
}


class DecompositionError(KilnError):
    """Re-tracing failed: a decomposition raised, recursed forever, or met a value it cannot record."""


class GraphRecorder(TorchDispatchMode):
    """Records ATen calls on fake tensors into ``graph``, decomposing those in ``table``."""

    def __init__(self, graph: fx.Graph, table: Mapping[OpOverload, Callable[..., Any]],
                 fake_mode: FakeTensorMode, root: torch.nn.Module, functionalize: bool = False) -> None:
        super().__init__()
        self.functionalize = functionalize
        self._views: set[int] = set()  # ids of tensors that alias another (a view's output or base)
        self._inputs: set[int] = set()
        self.graph = graph
        self.table = table
        self.fake_mode = fake_mode
        self.root = root
        self.carried_meta: dict[str, Any] = {}
        self._tensors: dict[int, tuple[torch.Tensor, fx.Node]] = {}
        self._fakes_of_real: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._symbols: dict[sympy.Symbol, fx.Node | tuple[fx.Node, str, int]] = {}
        self._sym_nodes: dict[sympy.Expr, fx.Node] = {}
        self._depth = 0
        self._n_consts = 0

    # -- binding values to nodes ---------------------------------------------------------------
    def bind(self, value: Any, node: fx.Node) -> None:
        """Tie a fake tensor (or a SymInt or SymFloat input) to the node that produces it."""
        if isinstance(value, torch.Tensor):
            self._tensors[id(value)] = (value, node)
            self._inputs.add(id(value))
            self._bind_shape_symbols(value, node)
        elif isinstance(value, (torch.SymInt, torch.SymFloat)):
            expr = value.node.expr
            if isinstance(expr, sympy.Symbol):
                self._symbols.setdefault(expr, node)

    def _bind_shape_symbols(self, t: torch.Tensor, node: fx.Node) -> None:
        for kind, vals in (("size", t.shape), ("stride", t.stride())):
            for d, s in enumerate(vals):
                if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                    self._symbols.setdefault(s.node.expr, (node, kind, d))
        off = t.storage_offset()
        if isinstance(off, torch.SymInt) and isinstance(off.node.expr, sympy.Symbol):
            self._symbols.setdefault(off.node.expr, (node, "offset", 0))

    def node_of(self, t: torch.Tensor) -> fx.Node | None:
        hit = self._tensors.get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def constant(self, t: torch.Tensor) -> tuple[torch.Tensor, fx.Node]:
        """A real tensor met during tracing becomes a ``get_attr`` constant of the result module."""
        hit = self._fakes_of_real.get(id(t))
        if hit is not None and hit[0] is t:
            fake = hit[1]
            return fake, self._tensors[id(fake)][1]
        name = f"_tensor_constant{self._n_consts}"
        self._n_consts += 1
        self.root.register_buffer(name, t, persistent=False)  # no copy: runs under the fake mode
        node = self.graph.get_attr(name)
        fake = self.fake_mode.from_tensor(t, static_shapes=True)
        node.meta["val"] = fake
        self._fakes_of_real[id(t)] = (t, fake)
        self._tensors[id(fake)] = (fake, node)
        return fake, node

    def to_fake(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            return self.constant(x)[0]
        return x

    def to_arg(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            node = self.node_of(x)
            if node is None:
                if isinstance(x, FakeTensor):
                    raise DecompositionError(
                        f"a fake tensor of shape {tuple(x.shape)} was not produced inside this trace; "
                        "decompositions must compute every tensor from their inputs with ATen calls")
                node = self.constant(x)[1]
            return node
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return self.sym_arg(x)
        return x

    # -- symbolic sizes ------------------------------------------------------------------------
    def sym_arg(self, s: torch.SymInt | torch.SymFloat | torch.SymBool) -> Any:
        expr = s.node.expr
        if expr.is_number:
            return int(expr) if isinstance(s, torch.SymInt) else s.node.pytype(expr)
        node = self._expr_node(expr)
        node.meta.setdefault("val", s)
        return node

    def _expr_node(self, expr: sympy.Expr) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr.is_number:
            return float(expr)
        if expr in self._sym_nodes:
            return self._sym_nodes[expr]
        node = self._build_expr(expr)
        self._sym_nodes[expr] = node
        return node

    def _build_expr(self, expr: sympy.Expr) -> fx.Node:
        if isinstance(expr, sympy.Symbol):
            src = self._symbols.get(expr)
            if src is None:
                raise DecompositionError(f"symbolic size {expr} is not bound to any graph input")
            if isinstance(src, fx.Node):
                return src
            node, kind, d = src
            op = {"size": torch.ops.aten.sym_size.int, "stride": torch.ops.aten.sym_stride.int,
                  "offset": torch.ops.aten.sym_storage_offset.default}[kind]
            return self.graph.call_function(op, (node, d) if kind != "offset" else (node,))
        binary = {sympy.Add: operator.add, sympy.Mul: operator.mul}
        for cls, fn in binary.items():
            if isinstance(expr, cls):
                acc = self._expr_node(expr.args[0])
                for a in expr.args[1:]:
                    acc = self.graph.call_function(fn, (acc, self._expr_node(a)))
                return acc
        name = type(expr).__name__
        # kiln.graph's table of size operations; CleanDiv and Python's max/min as decomp has always built them
        named: dict[str, Callable[..., Any]] = {**{k: v for k, v in SIZE_OPS.items() if k not in ("Add", "Mul", "Pow")},
                 "CleanDiv": operator.floordiv, "Max": max, "Min": min}
        if name in SIZE_UNARY_OPS:
            return self.graph.call_function(SIZE_UNARY_OPS[name], (self._expr_node(expr.args[0]),))
        if name in named:
            a, b = (self._expr_node(x) for x in expr.args[:2])
            return self.graph.call_function(named[name], (a, b))
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and 2 <= int(expr.exp) <= 8:
            # ``f * f`` (sympy's f**2) as the products the program computed: a SymFloat's ``** 2``
            # checks f >= 0 (kiln.graph's SymbolNodes builds powers the same way)
            base = self._expr_node(expr.base)
            acc = base
            for _ in range(int(expr.exp) - 1):
                acc = self.graph.call_function(operator.mul, (acc, base))
            return acc
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
            return self.graph.call_function(operator.pow, (self._expr_node(expr.base), int(expr.exp)))
        raise DecompositionError(f"cannot rebuild the symbolic size expression {expr} as graph nodes")

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: OpOverload, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.dispatch(func, tuple(args), dict(kwargs or {}))

    def dispatch(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Decompose ``func`` if the table has it (recursively), else record it."""
        fn = self.table.get(func)
        if fn is not None:
            if self._depth >= MAX_DEPTH:
                raise DecompositionError(f"decomposition of {op_name(func)} recursed {MAX_DEPTH} levels deep")
            self._depth += 1
            try:
                with self:
                    out = fn(*args, **kwargs)
            finally:
                self._depth -= 1
            if out is not NotImplemented:
                return out
        return self.record(func, args, kwargs)

    def record(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.functionalize and func._schema.is_mutable:
            return self._record_functional(func, args, kwargs)
        out = self._record(func, args, kwargs)
        if self.functionalize and any(r.alias_info is not None for r in func._schema.returns):
            for t in flat_tensors((args, kwargs)) + flat_tensors(out):
                self._views.add(id(t))
        return out

    def _record_functional(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An in-place op on a fresh, unaliased tensor becomes its functional form (simple functionalization)."""
        schema = func._schema
        base_name = schema.name.split("::")[-1]
        target = args[0] if args else None
        functional = _FUNCTIONAL_FORMS.get(func)
        if functional is None and base_name.endswith("_") and isinstance(target, torch.Tensor) and schema.arguments[0].alias_info is not None:
            packet = getattr(torch.ops.aten, base_name[:-1], None)
            functional = getattr(packet, func._overloadname, None) if packet is not None else None
        aliased = isinstance(target, torch.Tensor) and (id(target) in self._views or id(target) in self._inputs)
        if functional is None or aliased:
            why = "it writes to a graph input or a view" if aliased else "it has no functional form"
            raise DecompositionError(
                f"cannot functionalize {op_name(func)}: {why}; functionalize the program first "
                "(kiln.autograd does) or trace it without mutation")
        new = self._record(functional, args, kwargs)
        func(*tree_map(self.to_fake, args), **tree_map(self.to_fake, kwargs))  # keep the fake's metadata in step
        self._tensors[id(target)] = (cast(torch.Tensor, target), self._tensors[id(new)][1])
        return target

    def _record(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fargs, fkwargs = map_leaves(self.to_fake, (args, kwargs))
        out = func(*fargs, **fkwargs)  # the FakeTensorMode below this one computes it
        return self.emit(func, args, kwargs, out)

    def emit(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """Record ``func(*args, **kwargs)`` whose fake result ``out`` is already known (computed by
        ``_record``, or carried over from the graph being re-traced when its inputs did not change)."""
        if isinstance(out, (int, float, bool)) and not isinstance(out, torch.SymInt | torch.SymFloat | torch.SymBool):
            return out  # a static size query (aten.sym_size on a static shape): a constant, no node
        self.emit_node(func, args, kwargs, out)
        return out

    def emit_node(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> fx.Node:
        """The node of ``func(*args, **kwargs)`` with fake result ``out``: arguments become nodes
        (``to_arg``), each tensor of the result is tied to its node (``bind_output``)."""
        node_args = map_leaves(self.to_arg, args)
        node_kwargs = map_leaves(self.to_arg, kwargs)
        node = self.graph.call_function(func, node_args, node_kwargs)
        node.meta.update(self.carried_meta)
        node.meta["val"] = out
        if isinstance(out, torch.Tensor):
            self.bind_output(out, node, func, args, kwargs, None)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta.update(self.carried_meta)
                    item.meta["val"] = o
                    self.bind_output(o, item, func, args, kwargs, i)
                elif isinstance(o, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in o):
                    raise DecompositionError(f"{op_name(func)} returns nested tensor lists; not supported")
        elif isinstance(out, torch.SymInt | torch.SymFloat | torch.SymBool):
            self._sym_nodes.setdefault(out.node.expr, node)
        return node

    def bind_output(self, value: torch.Tensor, node: fx.Node, func: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any], index: int | None) -> None:
        """Tie ``value`` (the result of ``func``, or its item ``index``) to ``node``. A recorder that
        tracks views and mutations (kiln.autograd's) also notes what ``value`` aliases."""
        self._tensors[id(value)] = (value, node)

    def output_args(self, value: Any) -> Any:
        return tree_map(self.to_arg, value)


def flat_tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]
