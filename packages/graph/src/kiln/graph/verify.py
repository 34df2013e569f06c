"""Dialect verifiers: ``verify(gm, dialect)`` raises VerificationError naming the offending node."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import fx

from .core_ops import CORE_ATEN_OPS
from .dialects import Dialect
from .errors import VerificationError
from .printer import target_name

_ALWAYS_OK = {operator.getitem}
# symbolic-size arithmetic beside ``operator``/``math``: the torch.sym_* functions (kiln.graph.SymbolNodes)
# and ``torch.sym_sqrt`` (``math.sqrt`` of a size, as capture records it)
_SIZE_FUNCTIONS = {torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_sqrt}


def is_size_arithmetic(t: object) -> bool:
    """A graph target computing on symbolic sizes (SymInt/SymFloat values), not on tensors."""
    module = getattr(t, "__module__", "")
    return t in _SIZE_FUNCTIONS or module in ("_operator", "math", "builtins") or (
        module == "torch" and getattr(t, "__name__", "").startswith("sym_"))



def _fail(node: fx.Node, why: str) -> VerificationError:
    return VerificationError(f"node %{node.name} ({node.format_node()}): {why}")


def _is_functional(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if schema.is_mutable:
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def is_pure_op(op: torch._ops.OpOverload) -> bool:
    """An op that writes none of its arguments and returns no alias of one: a graph may record it as
    one opaque call (kiln.capture and kiln.autograd do for other libraries' ``torch.library`` ops)."""
    schema = op._schema
    return not schema.is_mutable and all(a.alias_info is None for a in (*schema.arguments, *schema.returns))


def _check_torch(gm: fx.GraphModule, node: fx.Node) -> None:
    if node.op == "call_module":
        raise _fail(node, "torch dialect lifts modules away: parameters must be placeholders")
    if node.op == "get_attr":
        obj = getattr(gm, str(node.target), None)
        if not isinstance(obj, (fx.GraphModule, torch.Tensor)):
            raise _fail(node, "get_attr may only name a subgraph or a constant tensor")
    if node.op == "call_method" and not hasattr(torch.Tensor, str(node.target)):
        raise _fail(node, f"{node.target!r} is not a torch.Tensor method")


# namespaces of lower-level IRs: ops from them in an ATen graph mean a decomposition went too far
_NOT_ATEN = frozenset({"prims", "prim", "kiln_prims"})


def _aten_check(core: bool) -> Callable[[fx.GraphModule, fx.Node], None]:
    def check(gm: fx.GraphModule, node: fx.Node) -> None:
        if node.op in ("call_method", "call_module"):
            raise _fail(node, f"{node.op} is not allowed in the {'core_aten' if core else 'aten'} dialect")
        if node.op != "call_function" or node.target in _ALWAYS_OK:
            return
        t = node.target
        if isinstance(t, torch._ops.HigherOrderOperator):
            return
        if not isinstance(t, torch._ops.OpOverload):
            if is_size_arithmetic(t):
                return
            raise _fail(node, f"{target_name(t)} is not an ATen operator overload")
        if t.namespace in _NOT_ATEN:  # other libraries' ops (torch.library custom ops) are opaque calls
            raise _fail(node, f"operator namespace {t.namespace!r} is not ATen")
        if not _is_functional(t):
            raise _fail(node, f"{target_name(t)} mutates its inputs; the dialect is functional")
        if core and t.namespace == "aten" and target_name(t) not in CORE_ATEN_OPS and \
                target_name(t) not in _SYM_QUERIES:
            raise _fail(node, f"{target_name(t)} is not in the core ATen set (kiln.graph.CORE_ATEN_OPS)")
    return check


# Size queries of symbolic shapes: metadata, not computation; every dialect may contain them.
_SYM_QUERIES = {"aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
                "aten.sym_storage_offset.default"}


def _check_prims(gm: fx.GraphModule, node: fx.Node) -> None:
    if node.op in ("call_method", "call_module"):
        raise _fail(node, f"{node.op} is not allowed in the prims dialect")
    if node.op != "call_function" or node.target in _ALWAYS_OK:
        return
    t = node.target
    if isinstance(t, torch._ops.OpOverload) and (t.namespace == "kiln_prims" or target_name(t) in _SYM_QUERIES):
        return
    if is_size_arithmetic(t):
        return
    raise _fail(node, f"{target_name(t)} is not a kiln_prims operator")


VERIFIERS: dict[Dialect, Callable[[fx.GraphModule, fx.Node], None]] = {
    Dialect.TORCH: _check_torch,
    Dialect.ATEN: _aten_check(core=False),
    Dialect.CORE_ATEN: _aten_check(core=True),
    Dialect.PRIMS: _check_prims,
}


def verify(gm: fx.GraphModule, dialect: Dialect | str) -> None:
    """Check ``gm`` against ``dialect``'s contract, including its subgraphs."""
    d = Dialect(dialect) if isinstance(dialect, str) else dialect
    try:
        gm.graph.lint()
    except Exception as e:
        raise VerificationError(f"graph is malformed: {e}") from e
    check = VERIFIERS[d]
    for node in gm.graph.nodes:
        check(gm, node)
    for _, sub in gm.named_children():
        if isinstance(sub, fx.GraphModule):
            verify(sub, d)
