"""``torch.cond`` nodes in a torch-dialect graph, traced into plain functional ATen.

Note: both branches are traced (they are functional by torch.cond's contract) and every output is
selected with ``aten.where(pred, true_out, false_out)``. That keeps the graph a straight line the
partitioner and code generators understand, and it is differentiable: ``where``'s backward routes the
gradient to the branch taken and zeros to the other. The price is that both branches run. It needs
each pair of branch outputs to agree in shape and dtype; otherwise tracing stops with an error naming
the node. A Python-bool predicate (known while tracing) just traces the branch it picks.

Known difference from eager: a branch not taken still runs, so its gradient is ``0 * d(branch)``;
where that local derivative is inf/nan (``sqrt`` of a negative number in the branch not taken) the
gradient becomes nan, as with any ``torch.where`` written by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import AutogradTraceError
from .tracer import TracingMode


def is_cond(target: Any) -> bool:
    """``torch.ops.higher_order.cond`` (what capture emits) or the ``torch.cond`` entry point."""
    hop = getattr(getattr(torch.ops, "higher_order", None), "cond", None)
    return (hop is not None and target is hop) or target is getattr(torch, "cond", None)


def _cond_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any, Sequence[Any]]:
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    missing = [n for n in names if n not in bound]
    if missing:
        raise AutogradTraceError(f"a cond node is missing its {', '.join(missing)} argument(s)")
    return bound["pred"], bound["true_fn"], bound["false_fn"], tuple(bound["operands"])


def _scalar_pred(pred: Any, where: str) -> Any:
    """A 0-dim bool tensor (or a Python bool) to select with."""
    if isinstance(pred, torch.Tensor):
        if pred.numel() != 1:
            raise AutogradTraceError(f"{where}: the predicate has shape {tuple(pred.shape)}; torch.cond "
                                     "needs a single-element (boolean) tensor")
        pred = pred.reshape(())
        return pred if pred.dtype == torch.bool else pred.ne(0)
    if isinstance(pred, (bool, int)):
        return bool(pred)
    raise AutogradTraceError(f"{where}: unsupported predicate {type(pred).__name__}; torch.cond takes a "
                             "boolean scalar tensor or a Python bool (symbolic predicates need dynamic "
                             "shapes, which kiln.autograd does not trace)")


RunBranch = Callable[[fx.GraphModule, Sequence[Any]], Any]


def _run_branch(run: RunBranch, rec: TracingMode, branch: Any, operands: Sequence[Any], label: str,
                where: str) -> Any:
    if not isinstance(branch, fx.GraphModule):
        if not callable(branch):
            raise AutogradTraceError(f"{where}: the {label} branch is a {type(branch).__name__}, not a "
                                     "GraphModule or callable")
        branch = fx.symbolic_trace(branch)
    versions = {id(r): r.version for r in rec.roots}
    try:
        out = run(branch, operands)
    except AutogradTraceError as e:
        raise AutogradTraceError(f"{where}, {label} branch: {e}") from e
    written = [r for r in rec.roots if id(r) in versions and r.version != versions[id(r)]]
    if written:
        raise AutogradTraceError(f"{where}: the {label} branch mutates one of its inputs in place; "
                                 "torch.cond branches must be functional (return the new value instead)")
    return out


def _select(pred: torch.Tensor, t: Any, f: Any, i: int, where: str) -> Any:
    if not isinstance(t, torch.Tensor) or not isinstance(f, torch.Tensor):
        if isinstance(t, torch.Tensor) or isinstance(f, torch.Tensor) or t != f:
            raise AutogradTraceError(f"{where}: output {i} is {t!r} in the true branch and {f!r} in the "
                                     "false branch; kiln.autograd selects tensor outputs only")
        return t
    if t.shape != f.shape or t.dtype != f.dtype or t.device != f.device:
        raise AutogradTraceError(
            f"{where}: output {i} differs between the branches (true: {tuple(t.shape)} {t.dtype} "
            f"{t.device}, false: {tuple(f.shape)} {f.dtype} {f.device}); kiln.autograd traces torch.cond "
            "as a select of both branches, which needs outputs of one shape and dtype. Make both "
            "branches return the same shapes, or let this be a graph break.")
    return torch.where(pred, t, f)


def trace_cond(run: RunBranch, rec: TracingMode, node_name: str, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
    """Trace a cond node: both branches under the active tracer, outputs selected with ``where``.

    ``run(branch_gm, operands)`` interprets a branch on the (fake) operands with the caller's
    interpreter, so nested conds, constants and lifted parameters work as in the parent graph.
    """
    where = f"torch.cond node {node_name!r}"
    pred, true_fn, false_fn, operands = _cond_args(args, kwargs)
    pred = _scalar_pred(pred, where)
    if isinstance(pred, bool):
        return _run_branch(run, rec, true_fn if pred else false_fn, operands, str(pred).lower(), where)
    t_out = _run_branch(run, rec, true_fn, operands, "true", where)
    f_out = _run_branch(run, rec, false_fn, operands, "false", where)
    t_flat, t_spec = tree_flatten(t_out)
    f_flat, f_spec = tree_flatten(f_out)
    if t_spec != f_spec:
        raise AutogradTraceError(f"{where}: the branches return different structures ({t_spec} vs "
                                 f"{f_spec}); both must return the same number of tensors")
    return tree_unflatten([_select(pred, t, f, i, where) for i, (t, f) in enumerate(zip(t_flat, f_flat))],
                          t_spec)
