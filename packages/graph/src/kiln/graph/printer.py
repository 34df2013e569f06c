"""A stable, readable text form of an FX graph, used by every stage's ``as_text()`` and by golden tests."""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
from torch import fx

from .spec import TensorSpec


def target_name(target: Any) -> str:
    """A stable name for a call target: ``aten.add.Tensor``, ``torch.relu``, ``operator.getitem``."""
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target._qualified_op_name.replace('::', '.')}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.__name__}"
    module: str = getattr(target, "__module__", None) or ""
    name: str = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target)))
    if module in ("_operator", "operator") or getattr(operator, name, None) is target:
        return f"operator.{name}"
    if getattr(builtins, name, None) is target:
        return name
    short: str = getattr(target, "__name__", name)
    for prefix, ns in (("torch", torch), ("torch.nn.functional", torch.nn.functional),
                       ("torch.special", torch.special), ("torch.linalg", torch.linalg)):
        if getattr(ns, short, None) is target:
            return f"{prefix}.{short}"
    return f"{module}.{name}" if module else name


def node_spec(node: fx.Node) -> str:
    spec = node.meta.get("spec")
    if spec is None:
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor):
            spec = TensorSpec.from_tensor(val)
        elif isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
            return "(" + ", ".join(TensorSpec.from_tensor(v).as_text() for v in val) + ")"
        elif val is not None:
            return type(val).__name__
    if isinstance(spec, TensorSpec):
        return spec.as_text()
    return ""


def _fmt(a: Any) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_fmt(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v)}" for k, v in a.items()) + "}"
    if isinstance(a, torch.dtype):
        return str(a)
    return repr(a)


def print_graph(gm: fx.GraphModule | fx.Graph, *, specs: bool = True) -> str:
    """One line per node; names and formatting are deterministic for equal graphs."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    lines: list[str] = []
    for node in graph.nodes:
        spec = node_spec(node) if specs else ""
        ann = f"  # {spec}" if spec else ""
        if node.op == "placeholder":
            lines.append(f"%{node.name} = input {node.target!r}{ann}")
        elif node.op == "output":
            lines.append(f"return {_fmt(node.args[0])}")
        elif node.op == "get_attr":
            lines.append(f"%{node.name} = get_attr {node.target!r}{ann}")
        else:
            args = [_fmt(a) for a in node.args] + [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()]
            head = f".{node.target}" if node.op == "call_method" else target_name(node.target)
            if node.op == "call_module":
                head = f"module[{node.target}]"
            lines.append(f"%{node.name} = {head}({', '.join(args)}){ann}")
    return "\n".join(lines)
