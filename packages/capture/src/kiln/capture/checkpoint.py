"""``torch.utils.checkpoint.checkpoint`` inside compiled code: the function is traced inline and every node
it records carries ``meta["kiln_checkpoint"]`` (a region number). kiln.autograd's partitioner recomputes
the region's deterministic values in the backward instead of saving them (random ops are saved, so a
recompute never draws new values), as eager's checkpoint does; values and gradients are the function's.

A region that writes in place to a tensor from outside it (a BatchNorm's running statistics, a buffer's
``add_``) breaks the graph at the checkpoint call, which then runs in Python: eager's recompute in the
backward repeats those writes (running statistics are updated twice per step), which a recompute of the
region's values alone would not.

Eager's reentrant checkpoint (``use_reentrant=True``, and torch's default when it is not given) gives
parameters inside the region no gradient when no tensor argument requires grad; such a call, and calls
with a ``context_fn`` (selective checkpointing policies), break the graph and run in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch import fx
from torch.utils._pytree import tree_leaves

from kiln.graph import CHECKPOINT_TAG

from .errors import GraphBreak

if TYPE_CHECKING:
    from .frame import Frame

_OPTIONS = ("preserve_rng_state", "determinism_check", "debug", "early_stop", "respect_saved_tensors_hooks")


def activation_checkpoint(frame: Frame, args: list, kwargs: dict) -> Any:
    """``checkpoint(function, *args, use_reentrant=..., **kwargs)`` traced as ``function(*args, **kwargs)``
    in a checkpoint region."""
    if not args:
        raise GraphBreak("torch.utils.checkpoint.checkpoint without a function")
    kwargs = dict(kwargs)
    reentrant = kwargs.pop("use_reentrant", None)
    context_fn = kwargs.pop("context_fn", torch_checkpoint.noop_context_fn)
    for name in _OPTIONS:
        kwargs.pop(name, None)
    if context_fn is not torch_checkpoint.noop_context_fn:
        raise GraphBreak("torch.utils.checkpoint.checkpoint with a context_fn (a selective checkpoint policy)",
                         "the call runs in Python")
    fn, rest = args[0], list(args[1:])
    if reentrant is not False:
        if kwargs:
            raise GraphBreak("reentrant torch.utils.checkpoint.checkpoint with keyword arguments",
                             "eager raises here; the call runs in Python")
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in rest):
            raise GraphBreak("reentrant torch.utils.checkpoint.checkpoint whose tensor arguments need no grad",
                             "eager gives its parameters no gradient; the call runs in Python, as eager")
    tracer = frame.tracer
    outer = tracer.checkpoint_region
    tracer.checkpoint_regions += 1
    tracer.checkpoint_region = tracer.checkpoint_regions
    try:
        return frame.call(fn, rest, kwargs)
    finally:
        tracer.checkpoint_region = outer


def _norm_stats_written(target: Any, args: tuple, kwargs: dict) -> list:
    """The running statistics a norm call updates in place: the fake kernels write them without
    bumping their version counters."""
    def arg(i: int, name: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(name, default)
    if target is F.batch_norm and arg(5, "training", False):
        return [arg(1, "running_mean"), arg(2, "running_var")]
    if target is torch.batch_norm and arg(5, "training", False):
        return [arg(3, "running_mean"), arg(4, "running_var")]
    if target is F.instance_norm and arg(5, "use_input_stats", True):
        return [arg(1, "running_mean"), arg(2, "running_var")]
    return []


def guard_region_writes(region: int, node_of: dict[int, fx.Node], target: Any, args: tuple,
                        kwargs: dict) -> Callable[[], None]:
    """Call before running ``target`` in checkpoint ``region``; the returned check, called after it, breaks
    the graph if the call wrote in place to a tensor made outside the region (eager's recompute in the
    backward would write it again)."""
    def made_outside(t: torch.Tensor) -> bool:
        node = node_of.get(id(t))
        tag = None if node is None else node.meta.get(CHECKPOINT_TAG)
        return tag is None or tag < region

    def outside(t: Any) -> bool:  # a view made inside of a tensor from outside writes to the latter
        return isinstance(t, torch.Tensor) and (made_outside(t) or t._base is not None and made_outside(t._base))
    tensors = [t for t in tree_leaves((args, kwargs)) if outside(t)]
    versions = [t._version for t in tensors]
    stats = [t for t in _norm_stats_written(target, args, kwargs) if outside(t)]

    def check() -> None:
        if stats or any(t._version != v for t, v in zip(tensors, versions)):
            raise GraphBreak(f"{_name(target)} inside torch.utils.checkpoint writes in place to a tensor "
                             "from outside the checkpointed function (a buffer such as BatchNorm's running "
                             "statistics)", "eager's recompute in the backward writes it again; the "
                             "checkpoint call runs in Python, as eager")
    return check


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", type(target).__name__)
