"""The ATen tracer: kiln.decomp's recorder (``GraphRecorder``, the one ATen recorder: a TorchDispatchMode
over FakeTensorMode that applies a decomposition table and records every other ATen op into an
fx.Graph), extended with what autograd needs: functionalization of views and mutations as it goes,
symbolic sizes bound to the inputs only, library ops, and constants lifted to buffers.

Note: functionalization happens here, op by op, instead of as a later graph pass. Each fake tensor maps
to an ``Alias`` (its root storage plus view chain). An in-place or ``out=`` op is recorded as its
functional twin and its result is *written* into the mutated tensor: a root simply gets a new node, a
view is scattered back into its root (``views.inverse``) and every other alias of that root is
regenerated from the new root the next time it is read (``node_of``). What is left at the end is a
functional graph plus a list of inputs whose roots were written (returned as extra outputs).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from kiln.decomp import GraphRecorder
from kiln.graph import SymbolNodes, is_pure_op, lazy_graph_module, map_leaves, may_overlap_itself

from . import ops
from .errors import AutogradTraceError
from .rewrites import VENDOR_REWRITES
from .views import Alias, Root, ViewStep, inverse, is_dense, replay

aten = torch.ops.aten
Decompositions = Mapping[torch._ops.OpOverload, Callable[..., Any]]

_CONSTANT_OPS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}


_INTERNAL_NAMESPACES = frozenset({"prim", "prims", "profiler", "debugprims"})


def _is_view_op(func: Any) -> bool:
    """``func``'s schema says its outputs alias its input without writing it (view, unfold, split...)."""
    returns = getattr(getattr(func, "_schema", None), "returns", ())
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _aliases(out: Any, base: Any) -> bool:
    """Every tensor ``out`` holds shares ``base``'s memory (fake tensors compare their storages)."""
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return isinstance(base, torch.Tensor) and bool(outs) and all(torch._C._is_alias_of(t, base) for t in outs)  # type: ignore[attr-defined]


def _bind(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound: dict[str, Any] = {}
    schema_args = func._schema.arguments
    for a, v in zip(schema_args, args):
        bound[a.name] = v
    bound.update(kwargs)
    for a in schema_args:  # the dispatcher drops arguments equal to their defaults
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _call_args(fop: torch._ops.OpOverload, bound: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for a in fop._schema.arguments:
        if a.name not in bound:
            continue
        if a.kwarg_only:
            kwargs[a.name] = bound[a.name]
        else:
            args.append(bound[a.name])
    return tuple(args), kwargs


def _drop_running_stats(func: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # Training-mode batch-norm backward reads the saved mean/invstd, never the running stats; passing
    # them would make the partitioner save the *updated* running stats (new tensors after
    # functionalization) for nothing: 2 extra vectors per BatchNorm that eager does not keep.
    b = _bind(func, args, kwargs)
    if not b.get("train") or (b.get("running_mean") is None and b.get("running_var") is None):
        return args, kwargs
    b["running_mean"] = b["running_var"] = None
    return _call_args(func, b)


def _special_mutation(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ops.Mutation | None:
    # native_batch_norm writes running stats in training without declaring it in its schema.
    if func is aten.native_batch_norm.default:
        b = _bind(func, args, kwargs)
        if b.get("training") and isinstance(b.get("running_mean"), torch.Tensor):
            return ops.Mutation(aten._native_batch_norm_legit_functional.default,
                                ("running_mean", "running_var"), (3, 4))
    return None


class TracingMode(GraphRecorder):
    """kiln.decomp's recorder, functionalizing: ``decompositions`` run in place of their ops (the base
    class's dispatch); every other op reaches ``record``, which records its functional form and keeps
    the fake-tensor -> node state of views and mutated storages (``Alias``/``Root``)."""

    def __init__(self, fake_mode: FakeTensorMode, decompositions: Decompositions | None = None) -> None:
        super().__init__(fx.Graph(), dict(decompositions or {}), fake_mode, torch.nn.Module())
        self.aliases: dict[int, Alias] = {}
        self.roots: list[Root] = []
        self.constants: dict[str, torch.Tensor] = {}
        # symbolic sizes as nodes: a symbol is the sym_size of the first input having it (or the SymInt
        # input itself), an expression is built from those (kiln.graph.SymbolNodes)
        self.syms = SymbolNodes(self.graph)

    # ---- graph building ----
    def emit_on_nodes(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.Node, Any]:
        """Add a node whose arguments are already nodes; its fake value is computed by running ``target``."""
        vals = tree_map(lambda a: a.meta["val"] if isinstance(a, fx.Node) else a, (args, kwargs))
        val = target(*vals[0], **vals[1])  # runs on fake tensors (this mode is off while it handles an op)
        node = self.graph.call_function(target, map_leaves(self.syms.arg, args), map_leaves(self.syms.arg, kwargs))
        node.meta["val"] = val
        return node, val

    def placeholder(self, name: str, value: Any, input_index: int | None) -> fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = value
        if isinstance(value, torch.Tensor):
            self._new_root(value, node, input_index)
            if input_index is not None:  # sizes come from the inputs, never from the tangents
                self.syms.bind_tensor(node, value)
        elif isinstance(value, (torch.SymInt, torch.SymFloat)) and value.node.expr.is_Symbol:
            self.syms.bind_node(value.node.expr, node)  # a symbolic int or float argument
        return node

    def _new_root(self, t: torch.Tensor, node: fx.Node, input_index: int | None = None) -> Alias:
        root = Root(t, node, input_index)
        self.roots.append(root)
        alias = Alias(t, root, (), node)
        self.aliases[id(t)] = alias
        return alias

    def add_constant(self, real: torch.Tensor, fake: torch.Tensor) -> fx.Node:
        """A real tensor the graph reads becomes a buffer of the result module (``finish``)."""
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = real
        node = self.graph.get_attr(name)
        node.meta["val"] = fake
        self._new_root(fake, node)
        return node

    # ---- functional view of tensors ----
    def alias_of(self, t: torch.Tensor) -> Alias:
        a = self.aliases.get(id(t))
        if a is None or a.tensor is not t:
            const = getattr(t, "constant", None)
            if isinstance(const, torch.Tensor):
                self.add_constant(const, t)
                return self.aliases[id(t)]
            raise AutogradTraceError(
                f"a tensor of shape {tuple(t.shape)} reached the traced graph without being one of its "
                "inputs or computed inside it (a tensor captured from outside?). Pass it as a graph input.")
        return a

    def node_of(self, t: torch.Tensor) -> fx.Node:
        """The node holding ``t``'s current value; stale views are regenerated from their root."""
        a = self.alias_of(t)
        if a.version != a.root.version:
            node, val = a.root.node, a.root.tensor
            for step in a.chain:
                node, val = replay(self.emit_on_nodes, step, node, val)
            a.node, a.version = node, a.root.version
        return a.node

    def to_arg(self, x: Any) -> Any:
        """An op's argument as a graph argument: a tensor its current node, a symbolic size the node
        computing it (the base recorder's ``emit_node`` maps arguments with this)."""
        if isinstance(x, torch.Tensor):
            return self.node_of(x)
        return self.syms.arg(x)

    def emit_functional(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> fx.Node:
        """Record a functional op whose fake result is ``out``; its tensors are registered (views of
        their base, ``bind_output``)."""
        return self.emit_node(func, args, kwargs, out)

    def bind_output(self, value: torch.Tensor, node: fx.Node, func: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any], index: int | None) -> None:
        base = self.alias_of(args[0]) if ops.is_view(func) else None
        step = ViewStep(func, tuple(args[1:]), tuple(kwargs.items()), index) if base is not None else None
        self._register(value, node, base, step)

    def _register(self, t: torch.Tensor, node: fx.Node, base: Alias | None, step: ViewStep | None) -> None:
        known = self.aliases.get(id(t))
        if known is not None and known.tensor is t:
            return  # an op handed back a tensor we already track (e.g. a no-op alias)
        if base is None or step is None:
            self._new_root(t, node)
        else:
            self.aliases[id(t)] = Alias(t, base.root, base.chain + (step,), node, base.root.version)

    def write(self, t: torch.Tensor, node: fx.Node) -> None:
        """Make ``node`` the new value of ``t`` (and of every tensor sharing its storage)."""
        val = node.meta["val"]
        if val.dtype != t.dtype:
            node, val = self.emit_on_nodes(aten._to_copy.default, (node,), {"dtype": t.dtype})
        if tuple(val.shape) != tuple(t.shape):
            node, val = self.emit_on_nodes(aten.expand.default, (node, list(t.shape)), {})
            node, val = self.emit_on_nodes(aten.clone.default, (node,), {})
        a = self.alias_of(t)
        root = a.root
        if a.chain:
            root.node = self._scatter(root, a.chain, node, val)
        else:
            root.node = node
        root.version += 1
        root.mutated = True
        if not a.chain:
            a.node, a.version = root.node, root.version

    def _scatter(self, root: Root, chain: tuple[ViewStep, ...], src: fx.Node, src_val: Any) -> fx.Node:
        nodes, vals = [root.node], [root.tensor]
        for step in chain:
            n, v = replay(self.emit_on_nodes, step, nodes[-1], vals[-1])
            nodes.append(n)
            vals.append(v)
        final = vals[-1]
        if may_overlap_itself(final.shape, final.stride()):
            raise AutogradTraceError(f"cannot functionalize an in-place write into a view whose elements share "
                                     f"memory ({tuple(final.shape)} strided {tuple(final.stride())}): the order "
                                     "of the writes decides the values")
        if any(may_overlap_itself(v.shape, v.stride()) for v in vals[1:-1]):
            # a view on the way overlaps itself (unfold windows, expand): undoing it step by step would write
            # its shared elements in some order, stale ones included. The written view is a plain window of
            # the root: scattered into it directly.
            if not all(v.dtype == root.tensor.dtype for v in vals) or not is_dense(root.tensor):
                raise AutogradTraceError("cannot functionalize an in-place write through a view whose elements "
                                         "share memory, of a tensor that is not dense or through a dtype view")
            offset = final.storage_offset() - root.tensor.storage_offset()
            return self.emit_on_nodes(aten.as_strided_scatter.default,
                                      (root.node, src, list(final.shape), list(final.stride()), offset), {})[0]
        for j in reversed(range(len(chain))):
            try:
                src = inverse(self.emit_on_nodes, chain[j], nodes[j], vals[j], vals[j + 1], src, src_val)
            except NotImplementedError as e:
                raise AutogradTraceError(f"cannot functionalize an in-place write: {e}") from e
            src_val = src.meta["val"]
        return src

    def finish(self, outputs: list[Any]) -> fx.GraphModule:
        self.graph.output(tuple(outputs))
        root = torch.nn.Module()
        for name, t in self.constants.items():
            root.register_buffer(name, t)
        self.graph.eliminate_dead_code()
        return lazy_graph_module(root, self.graph)  # code made if it is ever run

    # ---- dispatch: what is not decomposed (GraphRecorder.dispatch applies the table first) ----
    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = super().dispatch(func, args, kwargs)
        if self.table.get(func) is not None and _is_view_op(func) and not _aliases(out, args[0] if args else None):
            # the table's decomposition of a view computes a copy (unfold: a gather of its windows): a write
            # through the view would reach the copy, never its base. Recorded as the view it is (the copy's
            # nodes are dead); finish_decomposition decomposes it in the functional graph.
            return self.record(func, args, kwargs)
        return out

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func in VENDOR_REWRITES:  # cuDNN/MIOpen batch norm: traced as the native ops
            with self:
                return VENDOR_REWRITES[func](*args, **kwargs)
        if func is aten.native_batch_norm_backward.default:
            args, kwargs = _drop_running_stats(func, args, kwargs)
        if not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        if func.namespace != "aten":
            return self._library_op(func, args, kwargs)
        if func in _CONSTANT_OPS:
            return self._constant(func, args)
        if func is aten._local_scalar_dense.default:
            raise AutogradTraceError("the graph reads a tensor's value into Python (.item()/.tolist()); "
                                     "kiln.autograd traces on fake tensors and cannot; make it a graph break")
        if func in ops.INPLACE_VIEWS:
            return self._inplace_view(func, args, kwargs)
        mutation = _special_mutation(func, args, kwargs) or ops.mutation_of(func)
        if mutation is None and ops.mutated_args(func):
            raise AutogradTraceError(f"{func} mutates its arguments and kiln.autograd has no functional "
                                     "form for it; rewrite the model without it or file an issue")
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            raise AutogradTraceError(f"{func} failed on fake tensors: {e}") from e
        if mutation is not None:
            self._functionalize(func, mutation, args, kwargs, out)
            return out
        if isinstance(out, torch.Tensor) or any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            self.emit_functional(func, args, kwargs, out)
        return out

    def _library_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op of another library (``torch.library`` custom ops: HF's ``transformers::grouped_mm_fallback``)
        runs through its fake kernel and is recorded as one node if it is functional; its backward is the
        autograd formula the library registered, traced like any other. Others run unrecorded, as before."""
        if not is_pure_op(func) or func.namespace in _INTERNAL_NAMESPACES:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            raise AutogradTraceError(f"{func} failed on fake tensors (does it have a fake kernel, "
                                     f"torch.library.register_fake?): {e}") from e
        if isinstance(out, torch.Tensor) or any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            self.emit_functional(func, args, kwargs, out)
        return out

    def _constant(self, func: Any, args: tuple[Any, ...]) -> Any:
        out = func(*args)
        real = args[0]
        if isinstance(real, torch.Tensor) and not hasattr(real, "fake_mode"):
            self.add_constant(real, out)  # no detach/clone here: under fake mode they would make fakes
        else:
            self.emit_functional(aten.clone.default, (real,), {}, out)
        return out

    def _inplace_view(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t = args[0]
        a = self.alias_of(t)
        if a.root.input_index is not None and not a.chain:
            raise AutogradTraceError(f"{func} changes the metadata of a graph input in place; "
                                     "kiln.autograd does not support that (use the out-of-place view)")
        view_op = ops.INPLACE_VIEWS[func]
        before = self.node_of(t)
        # the op changes ``t``'s own sizes and strides: nodes holding ``t`` as their value keep what it was
        # (torch.quantile's lerp_ then unsqueeze_ left a gather node (4, 2) with the final (2, 4) value, and
        # kiln.inductor lowered that gather over the wrong shape)
        for n in self.graph.nodes:
            if n.meta.get("val") is t:
                n.meta["val"] = aten.alias.default(t)
        out = func(*args, **kwargs)
        step = ViewStep(view_op, tuple(args[1:]), tuple(kwargs.items()))
        node, _ = replay(self.emit_on_nodes, step, before, a.tensor)
        node.meta["val"] = t
        a.chain = a.chain + (step,)
        a.node, a.version = node, a.root.version
        return out

    def _functionalize(self, func: Any, m: ops.Mutation, args: tuple[Any, ...], kwargs: dict[str, Any],
                       out: Any) -> None:
        bound = _bind(func, args, kwargs)
        for name in m.drop_args:
            bound.pop(name, None)
        fargs, fkwargs = _call_args(m.functional, bound)
        result = m.functional(*fargs, **fkwargs)
        node = self.emit_functional(m.functional, fargs, fkwargs, result)
        if all(r.alias_info is None for r in func._schema.returns):
            # fresh results (native_batch_norm's output and statistics): the functional op's leading ones
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor):
                    src = self._getitem(node, i) if isinstance(result, (tuple, list)) else node
                    self._register(o, src, None, None)
        full = _bind(func, args, kwargs)
        for target, idx in zip(m.targets, m.result_for):
            dest = full.get(target)
            if dest is None:
                continue
            new = node if idx is None else self._getitem(node, idx)
            if isinstance(dest, (list, tuple)):
                for i, d in enumerate(dest):
                    self.write(d, self._getitem(new, i))
            else:
                self.write(dest, new)

    def _getitem(self, node: fx.Node, idx: int) -> fx.Node:
        for user in node.users:
            if user.target is operator.getitem and user.args[1] == idx:
                return user
        g = self.graph.call_function(operator.getitem, (node, idx))
        g.meta["val"] = node.meta["val"][idx]
        return g
