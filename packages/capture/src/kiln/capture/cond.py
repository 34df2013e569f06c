"""``torch.cond`` captured as a subgraph op, as PyTorch's compiler does.

In the torch-dialect graph a call ``torch.cond(pred, true_fn, false_fn, operands)`` becomes

    %cond_true_0 = get_attr cond_true_0          # an fx.GraphModule, a submodule of the root
    %cond_false_0 = get_attr cond_false_0
    %cond = torch.ops.higher_order.cond(%pred, %cond_true_0, %cond_false_0, (%a, %b, ...))
    %getitem = operator.getitem(%cond, 0)        # one per output

Both branch graphs take the same placeholders — the operands, then every tensor or size of the
enclosing graph a branch reads (closures, parameters), lifted as extra operands — and return a
tuple of tensors with matching shapes and dtypes. Graph breaks, new shape assumptions and side
effects inside a branch raise ``Unsupported`` (a branch is one graph or nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from .errors import GraphBreak, Unsupported
from .tracer import SubgraphScope

if TYPE_CHECKING:
    from .frame import Frame

_HINT = "keep torch.cond branches free of graph breaks, prints, .item() and writes to outside state"


def trace_cond(frame: Frame, args: list, kwargs: dict) -> Any:
    pred, true_fn, false_fn, operands = _bind(args, kwargs)
    if isinstance(pred, (bool, int)):  # a Python constant: only one branch can run
        return frame.call(true_fn if pred else false_fn, list(operands), {})
    where = frame.tracer.where
    if not isinstance(pred, (torch.Tensor, torch.SymBool)):
        raise Unsupported(f"torch.cond predicate is a {type(pred).__name__} at {where}; expected a "
                          "boolean tensor, a symbolic bool or a Python bool")
    if not isinstance(operands, (tuple, list)) or not all(isinstance(o, torch.Tensor) for o in operands):
        raise Unsupported(f"torch.cond operands must be a tuple of tensors at {where}")
    tracer = frame.tracer
    true_scope, true_outs, single = _branch(frame, true_fn, operands, "true")
    false_scope, false_outs, _ = _branch(frame, false_fn, operands, "false")
    _check_outputs(true_outs, false_outs, where)
    outer = _operand_nodes(tracer, operands, true_scope, false_scope)
    owner = tracer.scopes[-1].submodules if tracer.scopes else tracer.submodules
    k = sum(1 for name in owner if name.startswith("cond_true_"))
    names = (f"cond_true_{k}", f"cond_false_{k}")
    for name, scope in zip(names, (true_scope, false_scope)):
        _order_placeholders(scope, outer)
        root = torch.nn.Module()
        for sub_name, sub in scope.submodules.items():  # conds nested in this branch
            root.add_module(sub_name, sub)
        owner[name] = fx.GraphModule(root, scope.graph, class_name=name)
    graph = tracer.graph
    getters = [graph.get_attr(name) for name in names]
    node = graph.call_function(torch.ops.higher_order.cond,
                               (tracer.to_arg(pred), getters[0], getters[1], tuple(outer)))
    if tracer.location:
        node.meta["stack_trace"] = tracer.location
    with tracer.fake_mode:
        results = [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device,
                                       requires_grad=o.requires_grad or f.requires_grad)
                   for o, f in zip(true_outs, false_outs)]
    node.meta["val"] = list(results)
    tracer.register(results, node)
    return results[0] if single else tuple(results)


def _bind(args: list, kwargs: dict) -> tuple:
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    bound.setdefault("operands", ())
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"torch.cond() missing arguments: {', '.join(missing)}")
    return bound["pred"], bound["true_fn"], bound["false_fn"], bound["operands"]


def _branch(frame: Frame, fn: Any, operands: Any, which: str) -> tuple[SubgraphScope, list, bool]:
    tracer = frame.tracer
    shape_guards_before = len(tracer.shape_env.guards) if tracer.shape_env is not None else 0
    writes_before = (dict(tracer.attr_writes), len(tracer.mutation_log))
    scope = tracer.push_scope()
    try:
        try:
            out = frame.call(fn, list(operands), {})
        except GraphBreak as e:
            raise Unsupported(f"torch.cond {which} branch cannot be captured as one graph: {e.reason}\n"
                              f"  at {frame.tracer.where}\nhint: {_HINT}") from e
        single = isinstance(out, torch.Tensor)
        outs = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
        if outs is None or not all(isinstance(o, torch.Tensor) for o in outs):
            raise Unsupported(f"torch.cond {which} branch must return a tensor or a tuple of tensors, "
                              f"got {type(out).__name__} at {tracer.where}")
        scope.graph.output(tuple(tracer.to_arg(o) for o in outs))
    finally:
        tracer.pop_scope(scope)
    if tracer.shape_env is not None and len(tracer.shape_env.guards) != shape_guards_before:
        raise Unsupported(f"torch.cond {which} branch adds a shape assumption (a guard) at {tracer.where}; "
                          f"guards inside branches are not supported\nhint: {_HINT}")
    if (dict(tracer.attr_writes), len(tracer.mutation_log)) != writes_before:
        raise Unsupported(f"torch.cond {which} branch writes to state outside it at {tracer.where}\n"
                          f"hint: {_HINT}")
    return scope, outs, single


def _check_outputs(a: list, b: list, where: str) -> None:
    if len(a) != len(b):
        raise Unsupported(f"torch.cond branches return {len(a)} and {len(b)} tensors at {where}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            raise Unsupported(f"torch.cond branches disagree on output {i} at {where}: "
                              f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")


def _operand_nodes(tracer: Any, operands: Any, *scopes: SubgraphScope) -> list[fx.Node]:
    """The enclosing-graph nodes both branches take: the operands, then lifted free values."""
    out: list[fx.Node] = []
    for o in operands:
        n = tracer.to_arg(o)
        if n not in out:
            out.append(n)
    for scope in scopes:
        for n in scope.lifted:
            if n not in out:
                out.append(n)
    return out


def _order_placeholders(scope: SubgraphScope, outer: list[fx.Node]) -> None:
    for n in outer:
        if n not in scope.lifted:
            scope.lifted[n] = scope.placeholder(n)
    prev = scope.graph._root
    for n in outer:
        prev.append(scope.lifted[n])
        prev = scope.lifted[n]
