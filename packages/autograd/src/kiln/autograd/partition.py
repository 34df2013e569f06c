"""Splitting a joint graph into a forward graph and a backward graph.

- ``save_all``: the forward computes everything it can; every forward value the backward reads is saved.
- ``min_cut``: a max-flow/min-cut over the forward nodes (mincut.py) picks the cheapest set of tensors
  (in bytes) to save such that the backward can recompute everything else it needs from them with
  cheap ops only (pointwise, views, casts). Matmuls, convolutions, attention, reductions and random
  ops are banned from recomputation: when the backward needs one, it is saved (so dropout's backward
  uses the forward's mask).

Forward graph: ``(*primals) -> (*fw_outputs, *mutated_inputs, *saved, *saved_sizes)``.
Backward graph: ``(*saved, *saved_sizes, *tangents) -> (*grads)`` (one per ``signature.grad_inputs``);
``saved_sizes`` are symbolic scalars (SymInt or SymFloat placeholders; plain ints and floats at run time).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import fx

from kiln.graph import (
    CHECKPOINT_TAG,
    NO_GRADIENT,
    is_pure_op,
    lazy_graph_module,
    print_graph,
    size_hint,
)

from . import ops
from .errors import AutogradTraceError
from .joint import JointGraph
from .mincut import CutNetwork
from .signature import GraphSignature

PartitionerName = Literal["min_cut", "save_all"]


@dataclass(frozen=True)
class Partitioned:
    fw_gm: fx.GraphModule
    bw_gm: fx.GraphModule
    signature: GraphSignature
    saved: tuple[str, ...]  # joint-graph names of the saved values, in order
    saved_bytes: int
    partitioner: str
    saved_sizes: tuple[str, ...] = ()  # symbolic sizes the backward needs, saved as ints after the tensors

    @property
    def n_saved(self) -> int:
        """Saved tensors (the sizes in ``saved_sizes`` follow them)."""
        return len(self.saved)

    @property
    def n_saved_sizes(self) -> int:
        return len(self.saved_sizes)

    def as_text(self) -> str:
        sizes = f"; sizes: {', '.join(self.saved_sizes)}" if self.saved_sizes else ""
        return (f"# partitioner: {self.partitioner}; saved {self.n_saved} tensors, "
                f"{self.saved_bytes} bytes: {', '.join(self.saved)}{sizes}\n"
                f"{self.signature.as_text()}\n# ---- forward ----\n{print_graph(self.fw_gm)}\n"
                f"# ---- backward ----\n{print_graph(self.bw_gm)}")


def tensor_bytes(val: Any) -> int:
    """Bytes of a tensor; of a symbolic one at its size hints (the sizes it was captured at), so no
    decision here adds a guard."""
    if isinstance(val, torch.Tensor):
        n = val.numel()
        return size_hint(n) * val.element_size()
    return 0


def _is_size(n: fx.Node) -> bool:
    """A symbolic scalar: a size (SymInt), or a float argument or float math on sizes (SymFloat)."""
    return isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat))


def _ancestors(roots: Iterable[fx.Node], stop: set[fx.Node] | None = None) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = [r for r in roots if isinstance(r, fx.Node)]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if stop is not None and n in stop:
            continue
        todo.extend(n.all_input_nodes)
    return seen


@dataclass(frozen=True)
class _Split:
    primals: list[fx.Node]
    tangents: list[fx.Node]
    fw_outputs: list[fx.Node]
    grads: list[fx.Node | None]
    fw_nodes: set[fx.Node]  # what the forward computes anyway (ancestors of its outputs and primals)
    bw_nodes: set[fx.Node]  # what only the backward needs
    mutated_inputs: tuple[int, ...]
    effects: list[fx.Node]  # random ops no output reads: they run in the forward all the same


def _split(joint: JointGraph) -> _Split:
    g = joint.gm.graph
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    results = list(out.args[0])
    nfw = joint.n_forward_outputs
    ph = [n for n in g.nodes if n.op == "placeholder"]
    primals = [n for n in ph if str(n.target).startswith("primals_")]
    tangents = [n for n in ph if str(n.target).startswith("tangents_")]
    fw_outputs, grads = results[:nfw], results[nfw:]
    # a random op whose result nobody reads (``torch.randperm(8)`` unused, ``uniform_`` then ``fill_``)
    # still advances the generator in eager, and later draws depend on it: the forward runs it
    read = _ancestors([*fw_outputs, *grads]) | _descendants(tangents, set(g.nodes))
    effects = [n for n in g.nodes if n.op == "call_function" and ops.is_random(n.target) and n not in read]
    fw_nodes = _ancestors([*fw_outputs, *effects]) | set(primals)
    # The other results of a multi-output forward op (dropout's mask, norm statistics) are forward values
    # too: the op will not run again in the backward.
    fw_nodes |= {u for n in list(fw_nodes) for u in n.users if u.target is operator.getitem}
    # Sizes computed from the inputs alone (sym_size and arithmetic on it) are forward values: one the
    # backward needs is saved as an int, never the tensor it was read from.
    for n in g.nodes:
        if _is_size(n) and n not in fw_nodes and all(i in fw_nodes for i in n.all_input_nodes):
            fw_nodes.add(n)
    bw_nodes = _ancestors([x for x in grads if x is not None], stop=fw_nodes) - fw_nodes
    return _Split(primals, tangents, fw_outputs, grads, fw_nodes, bw_nodes, joint.signature.mutated_inputs,
                  effects)


def _needed_by_backward(s: _Split) -> set[fx.Node]:
    return {i for n in s.bw_nodes for i in n.all_input_nodes if i in s.fw_nodes} | \
        {x for x in s.grads if x is not None and x in s.fw_nodes}


def _save_all(s: _Split) -> list[fx.Node]:
    needed = _needed_by_backward(s)
    return [n for n in _order(s) if n in needed]


def _order(s: _Split) -> list[fx.Node]:
    return [n for n in s.primals[0].graph.nodes if n in s.fw_nodes] if s.primals else \
        [n for n in s.fw_nodes]


def _recomputable(n: fx.Node) -> bool:
    if n.target is operator.getitem:
        return True
    if isinstance(n.meta.get("val"), (torch.SymFloat, torch.SymBool)):
        return True  # scalar math over sizes (``1.0 / x.shape[0]``): the backward redoes it from saved sizes
    return ops.is_recomputable(n.target)


def _checkpointed(n: fx.Node) -> bool:
    """A tensor value traced inside ``torch.utils.checkpoint`` (capture's region tag) that the backward
    may compute again: anything but random draws (a recompute would draw new values) and ops with
    effects. The min-cut never saves it, as eager's checkpoint saves only the region's inputs. A
    multi-output op (an eval-mode BatchNorm, ``var_mean``) counts as its tuple, and one of its results as
    the op: they are recomputed together, or the result is saved."""
    if n.meta.get(CHECKPOINT_TAG) is None:
        return False
    val = n.meta.get("val")
    if n.target is operator.getitem:
        parent = n.args[0]
        return isinstance(val, torch.Tensor) and isinstance(parent, fx.Node) and _checkpointed(parent)
    if not (isinstance(val, torch.Tensor) or isinstance(val, (tuple, list)) and val
            and all(v is None or isinstance(v, torch.Tensor) for v in val)):
        return False
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded not in n.target.tags and is_pure_op(n.target)


_SCALE = 1 << 24  # byte weights dominate the tie-break term (graphs have far fewer nodes than this)


def _min_cut(s: _Split) -> list[fx.Node]:
    """Saved nodes = the forward nodes whose in->out edge is in a minimum source/sink cut."""
    net = CutNetwork()
    mutated = {s.primals[i] for i in s.mutated_inputs}
    net.node("source")
    net.node("sink")
    for n in s.fw_nodes:
        val = n.meta.get("val")
        if n in mutated:
            # an input written back after the forward: the backward must not read its old value
            net.add_edge(f"{n.name}_in", f"{n.name}_out")
        elif isinstance(val, torch.Tensor) and n.op == "placeholder" and val.requires_grad:
            # a parameter: alive anyway (the module holds it), so saving it costs no memory. Under AMP
            # the backward then recomputes each weight's bf16 cast instead of keeping it from the
            # forward (ResNet-50, batch 32: 54 casts, 54 MB less at the backward's start)
            net.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=0)
        elif _checkpointed(n):
            net.add_edge(f"{n.name}_in", f"{n.name}_out")  # no capacity attr: never saved, recomputed
        elif isinstance(val, (torch.SymInt, torch.SymFloat)):
            net.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=1)  # a scalar: about free to save
        elif isinstance(val, torch.Tensor):
            # bytes first; among equal-byte cuts prefer saving inputs (alive anyway) over new values
            tie = 0 if n.op == "placeholder" else 1
            net.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=tensor_bytes(val) * _SCALE + tie)
        else:
            net.add_edge(f"{n.name}_in", f"{n.name}_out")  # no capacity attr: infinite
        if n.op == "placeholder" or not (_recomputable(n) or _checkpointed(n)) or isinstance(val, torch.SymInt):
            net.add_edge("source", f"{n.name}_in")
        for user in n.users:
            if user in s.fw_nodes:
                net.add_edge(f"{n.name}_out", f"{user.name}_in")
    for n in _needed_by_backward(s):
        net.add_edge(f"{n.name}_out", "sink")
    reachable = net.source_side("source", "sink")
    return [n for n in _order(s) if f"{n.name}_in" in reachable and f"{n.name}_out" not in reachable]


def _size_exprs(val: Any) -> list[Any]:
    """The sympy expressions of a value's sizes: a SymInt's own, a tensor's sizes, strides and offset."""
    if isinstance(val, torch.SymInt):
        return [val.node.expr]
    if isinstance(val, torch.Tensor):
        return [x.node.expr for x in (*val.shape, *val.stride(), val.storage_offset())
                if isinstance(x, torch.SymInt)]
    return []


def _symbol_sizes(g: fx.Graph, s: _Split, bw_inputs: list[fx.Node]) -> list[fx.Node]:
    """Sizes the backward also takes so that every size symbol its inputs use is one of them whole.

    Note: a compiler reads each symbol from an input that is exactly it (a size, a stride, a SymInt).
    The cut may leave only compound values: ``x.chunk(3)[0]`` saved, its rows ``(s0 + 2) // 3``, says
    nothing of ``s0`` itself (which its output shapes are written in). The forward then also returns
    ``s0``: a size node of the forward that is exactly it, or one made from an input it is a size of."""
    bound: set[Any] = set()
    used: set[Any] = set()
    for n in bw_inputs:
        for e in _size_exprs(n.meta.get("val")):
            if e.is_Symbol:
                bound.add(e)
            used |= e.free_symbols
    missing = used - bound
    if not missing:
        return []
    found: dict[Any, fx.Node] = {}
    for n in [*s.primals, *sorted(s.fw_nodes, key=lambda n: n.name)]:
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr in missing:
            found.setdefault(val.node.expr, n)
    last = [n for n in g.nodes if n.op == "placeholder"][-1]  # new size nodes go after the inputs
    for p in s.primals:
        val = p.meta.get("val")
        for d, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            sym = size.node.expr if isinstance(size, torch.SymInt) else None
            if sym in missing and sym not in found:
                with g.inserting_after(last):
                    found[sym] = last = g.call_function(torch.ops.aten.sym_size.int, (p, d))
                found[sym].meta["val"] = size
    return [found[sym] for sym in sorted(found, key=str)]


def _descendants(roots: Iterable[fx.Node], within: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        for u in n.users:
            if u in within and u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _copy_graph(joint: fx.GraphModule, inputs: list[tuple[fx.Node, str]], outputs: list[fx.Node | None],
                where: str, lazy_after: list[fx.Node] | None = None,
                effects: Sequence[fx.Node] = ()) -> fx.GraphModule:
    """A new graph computing ``outputs`` from ``inputs`` (joint nodes that become placeholders), and
    running ``effects`` (random ops nothing reads: fx's dead-code elimination keeps them)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node, name in inputs:
        p = g.placeholder(name)
        p.meta.update(node.meta)
        env[node] = p
    need = _ancestors([*(o for o in outputs if o is not None), *effects], stop=set(env))

    def emit(root: fx.Node) -> None:
        """Copy ``root`` after whatever it needs that is not copied yet (iterative post-order)."""
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if n in env:
                continue
            if n.op == "placeholder":
                raise AutogradTraceError(f"partitioning bug: the {where} graph needs {n.name}, which it "
                                         "was not given")
            if ready:
                env[n] = g.node_copy(n, lambda x: env[x])
                continue
            stack.append((n, True))
            stack.extend((i, False) for i in reversed(n.all_input_nodes) if i not in env)

    # the nodes that follow from ``lazy_after`` (the tangents) keep the traced order; what is only
    # recomputed from saved tensors is placed right before its first reader, not all at the start:
    # every recomputed activation would otherwise be alive from the backward's first step
    anchored = _descendants(lazy_after, need) if lazy_after else need
    for n in joint.graph.nodes:
        if n in anchored:
            emit(n)
    for n in joint.graph.nodes:
        if n in need:
            emit(n)
    g.output(tuple(env[o] if o is not None else None for o in outputs))
    g.eliminate_dead_code()
    return lazy_graph_module(joint, g)  # the compilers read the nodes; code made if it is ever run


def partition(joint: JointGraph, partitioner: PartitionerName = "min_cut") -> Partitioned:
    """Split ``joint`` into forward and backward graphs, saving what ``partitioner`` decides."""
    if not joint.joint:
        raise ValueError("partition() needs a joint graph; this one is forward-only (trace_inference)")
    s = _split(joint)
    if partitioner == "min_cut":
        saved = _min_cut(s)
    elif partitioner == "save_all":
        saved = _save_all(s)
    else:
        raise ValueError(f"unknown partitioner {partitioner!r}; use 'min_cut' or 'save_all'")
    sizes = [n for n in saved if _is_size(n)]
    saved = [n for n in saved if not _is_size(n)]
    sizes += _symbol_sizes(joint.gm.graph, s, [*saved, *sizes, *s.tangents])
    for n in saved:
        if not isinstance(n.meta.get("val"), torch.Tensor):
            raise AutogradTraceError(f"partitioner {partitioner} chose to save non-tensor {n.name}")
    fw = _copy_graph(joint.gm, [(p, str(p.target)) for p in s.primals], [*s.fw_outputs, *saved, *sizes],
                     "forward", effects=s.effects)
    bw_inputs = [(n, f"saved_{n.name}") for n in (*saved, *sizes)] + [(t, str(t.target)) for t in s.tangents]
    bw = _copy_graph(joint.gm, bw_inputs, s.grads, "backward", lazy_after=s.tangents)
    return Partitioned(fw, bw, joint.signature, tuple(n.name for n in saved),
                       sum(tensor_bytes(n.meta["val"]) for n in saved), partitioner,
                       tuple(n.name for n in sizes))


def tangent_dependencies(bw_gm: fx.GraphModule, n_saved: int) -> tuple[tuple[int, ...], ...]:
    """For each gradient the backward returns, the tangents (by position) its value is computed from.

    The backward is linear in the tangents, so a gradient that reads none of the tangents autograd left
    undefined (outputs the loss did not use) is zero, and eager autograd never reaches its input at
    all: the caller returns None for it, as eager does (an optimizer skips a None gradient, but
    applies momentum and weight decay to a zero one). ``NO_GRADIENT`` for a gradient the backward does
    not compute (None: no output depends on that input)."""
    deps: dict[fx.Node, frozenset[int]] = {}
    position = 0
    for node in bw_gm.graph.nodes:
        if node.op == "placeholder":
            deps[node] = frozenset({position - n_saved}) if position >= n_saved else frozenset()
            position += 1
        elif node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            return tuple(tuple(sorted(deps.get(o, frozenset()))) if isinstance(o, fx.Node) else NO_GRADIENT
                         for o in outs)
        else:
            found: set[int] = set()
            for a in node.all_input_nodes:
                found |= deps.get(a, frozenset())
            deps[node] = frozenset(found)
    return ()
