"""``torch.utils.checkpoint.checkpoint`` inside compiled code: the function is traced inline and every node
it records carries ``meta["kiln_checkpoint"]`` (a region number). kiln.autograd's partitioner recomputes
the region's deterministic values in the backward instead of saving them (random ops are saved, so a
recompute never draws new values), as eager's checkpoint does; values and gradients are the function's.

Eager's reentrant checkpoint (``use_reentrant=True``, and torch's default when it is not given) gives
parameters inside the region no gradient when no tensor argument requires grad; such a call, and calls
with a ``context_fn`` (selective checkpointing policies), break the graph and run in Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint as torch_checkpoint

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
