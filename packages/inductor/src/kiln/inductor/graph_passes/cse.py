"""Identical pure ATen calls on the same arguments are computed once.

Traced programs repeat work the user wrote once: each attention layer of an HF model receives the same
mask, and kiln.autograd's attention turns it into that layer's additive bias (a ``zeros`` of padded rows,
a ``slice_scatter``, an ``expand``, an ``any`` over the keys for fully masked rows) -- 24 copies of the
same kernels and allocations in a 24-layer model. The loop IR fuses work inside a kernel but does not
merge equal kernels, so this graph pass does: a ``call_function`` node whose target and arguments
(after earlier merges) equal an earlier node's is replaced by it.

Only what is safe to share: ATen/prims overloads whose schema mutates nothing; never a random op
(``nondeterministic_seeded``: two draws must differ), an uninitialised factory (``empty``), a
collective (its calls are communication) or a value some mutating op takes (an in-place update must
not land in a value another node reads).

Two outputs that were different values and become one (``return x + 1, x + 1``, or a value and a view
of its copy) would share memory where eager's do not: writing into one would change the other. The later
of them is returned as a copy (``_unshare_outputs``).
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

_NAMESPACES = {"aten", "prims"}
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


def _mutates(target: object) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is None or schema.is_mutable


def _is_view(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _updated(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose memory some in-place op writes: its tensor arguments and the views' bases behind them."""
    marked: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not _mutates(node.target):
            continue
        todo = list(node.all_input_nodes)
        while todo:
            a = todo.pop()
            if a not in marked:
                marked.add(a)
                if _is_view(a) and a.args and isinstance(a.args[0], fx.Node):
                    todo.append(a.args[0])
    return marked


def _shareable(node: fx.Node, updated: set[fx.Node]) -> bool:
    t = node.target
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or node in updated:
        return False
    if t.namespace not in _NAMESPACES or t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags:
        return False
    return t._schema.name.split("::")[-1] not in _UNINITIALISED


def _key(value: object) -> Hashable:
    """A hashable form of a node's arguments (lists and dicts as tuples; floats by value and type, so
    that 1 and 1.0 stay apart, as do 0.0 and -0.0)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", *((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, float):
        return ("float", value, str(value))
    if isinstance(value, slice):
        return ("slice", _key(value.start), _key(value.stop), _key(value.step))
    hash(value)  # TypeError for what has no stable identity as a key
    return (type(value).__name__, value)


def storage_root(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and _is_view(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _flat_outputs(graph: fx.Graph) -> list[fx.node.Argument]:
    flat: list[fx.node.Argument] = []
    fx.node.map_aggregate(graph.output_node().args[0], flat.append)  # type: ignore[arg-type]
    return flat


def _unshare_outputs(graph: fx.Graph, before: list[fx.Node | None]) -> None:
    """Outputs whose memory the merges made one: each one after the first becomes a copy."""
    after = [storage_root(v) if isinstance(v, fx.Node) else None for v in _flat_outputs(graph)]
    first: dict[fx.Node, int] = {}
    copies: dict[int, fx.Node] = {}
    for j, root in enumerate(after):
        if root is None:
            continue
        i = first.setdefault(root, j)
        if i != j and before[i] is not before[j]:
            copies[j] = root
    if not copies:
        return
    out = graph.output_node()
    flat = _flat_outputs(graph)
    with graph.inserting_before(out):
        for j in copies:
            value = flat[j]
            assert isinstance(value, fx.Node)
            clone = graph.call_function(torch.ops.aten.clone.default, (value,))
            val = value.meta.get("val")
            if isinstance(val, FakeTensor):
                with val.fake_mode:
                    clone.meta["val"] = torch.ops.aten.clone.default(val)
            flat[j] = clone
    positions = iter(range(len(flat)))
    out.args = (fx.node.map_aggregate(out.args[0], lambda v: flat[next(positions)]),)


def eliminate_common_subexpressions(gm: fx.GraphModule) -> int:
    """Merge equal pure calls in ``gm`` (in place); returns how many nodes were removed."""
    seen: dict[Hashable, fx.Node] = {}
    before = [storage_root(v) if isinstance(v, fx.Node) else None for v in _flat_outputs(gm.graph)]
    updated = _updated(gm.graph)
    removed = 0
    for node in list(gm.graph.nodes):
        if not _shareable(node, updated):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is node:
            continue
        node.replace_all_uses_with(first)
        gm.graph.erase_node(node)
        removed += 1
    if removed:
        _unshare_outputs(gm.graph, before)
        gm.recompile()
    return removed
