"""Run-time wrappers around graphs compiled in-process: kiln.graph's compiled_call (the one
implementation, shared with the programs kiln.runtime loads) fed with this stage's GraphSignature."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.graph import (
    CallSignature,
    CompiledGraph,
    OutputRule,
    inference_call,
    release_saved,
    training_call,
)

from .signature import GraphSignature

Compiled = Callable[..., Any]

__all__ = ["call_signature", "make_inference_callable", "make_training_callable", "owned_call", "release_saved"]


def call_signature(sig: GraphSignature, grad_deps: Sequence[Sequence[int]] | None = None,
                   n_saved_sizes: int = 0) -> CallSignature:
    return CallSignature(
        sig.n_inputs, sig.n_graph_outputs, sig.mutated_inputs, sig.graph_output_differentiable,
        sig.grad_inputs,
        tuple(OutputRule(o.kind.value, o.index, o.size, o.stride, o.storage_offset, o.requires_grad, o.value)
              for o in sig.outputs),
        sig.out_spec, None if grad_deps is None else tuple(tuple(d) for d in grad_deps),
        n_saved_sizes, sig.symbols)


def owned_call(compiled: Compiled) -> Callable[[list], Any] | None:
    """The compiled graph's entry that takes the caller's references over (``call_owned(list)``:
    kiln.inductor's wrappers), or None."""
    fn = compiled.fn if isinstance(compiled, CompiledGraph) else compiled
    return getattr(fn, "call_owned", None)


def _list_call(compiled: Compiled) -> Callable[[list], Any]:
    def call(args: list) -> Any:
        out = compiled(*args)
        return out if isinstance(out, (tuple, list)) else (out,)
    return call


def make_inference_callable(sig: GraphSignature, compiled: Compiled) -> Callable[..., Any]:
    call = inference_call(call_signature(sig), _list_call(compiled))

    def run(*args: Any) -> Any:
        return call(list(args))
    return run


def make_training_callable(sig: GraphSignature, fw: Compiled, bw: Compiled, n_saved: int,
                           grad_deps: Sequence[Sequence[int]] | None = None,
                           n_saved_sizes: int = 0) -> Callable[..., Any]:
    """``grad_deps``: per gradient of the backward, the tangents it is computed from
    (``partition.tangent_dependencies``); a gradient whose tangents were all undefined is None.
    ``n_saved_sizes``: the forward's last outputs are that many ints (symbolic sizes), which the
    backward takes after the saved tensors."""
    call, function = training_call(call_signature(sig, grad_deps, n_saved_sizes), _list_call(fw), _list_call(bw),
                                   owned_call(bw))

    def run(*args: Any) -> Any:
        return call(list(args))
    run.autograd_function = function  # type: ignore[attr-defined]
    return run
