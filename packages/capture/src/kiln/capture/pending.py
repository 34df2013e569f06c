"""Pending collective results at a compiled frame's boundary.

A functional collective returned to user code is an ``AsyncCollectiveTensor``: a wrapper subclass
whose value is ready once its collective is waited for (eager waits at the first op that reads it).
A frame called with one takes its value: the frame waits for it at the call (eager would wait at its
first use inside the frame, so only the overlap with the frame's earlier work is lost) and traces the
plain tensor as a graph input. Gradients flow through the wait unchanged, as through the wrapper.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils import _pytree as pytree


class _Waited(torch.autograd.Function):
    """The waited value of a pending collective result, as a plain tensor on the autograd graph."""

    @staticmethod
    def forward(ctx: Any, pending: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        value = pending.trigger_wait()  # type: ignore[attr-defined]
        return value.view(value.shape)  # (a new tensor object: the wrapper keeps its own)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def _waited(pending: torch.Tensor) -> torch.Tensor:
    if pending.requires_grad and torch.is_grad_enabled():
        return _Waited.apply(pending)
    return pending.trigger_wait()  # type: ignore[attr-defined]


def wait_pending(args: tuple, kwargs: dict) -> tuple[tuple, dict, int] | None:
    """``args``/``kwargs`` with every AsyncCollectiveTensor in them (in lists, tuples and dicts too)
    replaced by its waited value, and how many there were; None when there is none."""
    funcol = sys.modules.get("torch.distributed._functional_collectives")
    if funcol is None:  # no functional collective ran in this process
        return None
    pending_type = funcol.AsyncCollectiveTensor
    count = sum(type(x) is pending_type for x in pytree.tree_leaves((args, kwargs)))
    if not count:
        return None
    new_args, new_kwargs = pytree.tree_map_only(pending_type, _waited, (args, kwargs))
    return tuple(new_args), dict(new_kwargs), count
