"""The verifier of inductor's graph level: what the graph passes may assume and must leave behind.

Not ``kiln.graph.verify(gm, "core_aten")``: inductor decomposes with kiln.decomp's ``inductor`` table
minus the ops it lowers natively (softmax, layer_norm, ...), and takes any ATen op it cannot lower as
a logged fallback, so neither core ATen nor a functional graph is guaranteed here (the reinplace pass
writes ``index_put_`` into inputs on purpose). What every pass and the lowering rely on is checked:

- the graph is well formed (``Graph.lint``);
- every call is an ATen or library operator overload, a ``getitem``, size arithmetic or a higher-order
  operator (no ``call_method``/``call_module``, no prims: lowering dispatches on overloads);
- every value carries its fake tensor in ``meta['val']`` (rewrites re-propagate what they create;
  layout decisions, rewrites and lowering read shapes, strides and devices from it).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.graph import VerificationError, is_size_arithmetic, target_name

# prims and kiln_prims sit below ATen (what a decomposition to primitives makes); "prim" holds metadata
# queries (prim::device) a trace may record, which lowering reads like size queries
_PRIMS = frozenset({"prims", "kiln_prims"})


def _fail(node: fx.Node, why: str) -> VerificationError:
    return VerificationError(f"inductor graph: node %{node.name} ({node.format_node()}): {why}")


def _check_call(node: fx.Node) -> None:
    t = node.target
    if t is operator.getitem or isinstance(t, torch._ops.HigherOrderOperator) or is_size_arithmetic(t):
        return
    if not isinstance(t, torch._ops.OpOverload):
        raise _fail(node, f"{target_name(t)} is not an operator overload")
    if t.namespace in _PRIMS:
        raise _fail(node, f"operator namespace {t.namespace!r}: decompositions went below ATen")


def verify_graph(gm: fx.GraphModule) -> None:
    """Raise ``VerificationError`` naming the first node that breaks the graph level's contract."""
    try:
        gm.graph.lint()
    except Exception as e:
        raise VerificationError(f"inductor graph is malformed: {e}") from e
    for node in gm.graph.nodes:
        if node.op in ("call_method", "call_module"):
            raise _fail(node, f"{node.op}: inductor's graphs call operators only")
        if node.op == "call_function":
            _check_call(node)
        if node.op != "output" and "val" not in node.meta:
            raise _fail(node, "no meta['val']: a rewrite made it without propagating fake tensors")
