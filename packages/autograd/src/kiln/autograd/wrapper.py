"""Run-time wrappers around compiled graphs.

Training: an ``autograd.Function`` whose forward runs the compiled forward graph and saves what the
partition chose, and whose backward runs the compiled backward graph. Inference: the compiled graph
alone. Both then write mutated inputs back with ``copy_`` and rebuild outputs that alias inputs or
other outputs as views, so callers see eager's aliasing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from kiln.graph import autocast_off, size_evaluator

from .errors import DoubleBackwardError
from .signature import GraphSignature, OutputKind

Compiled = Callable[..., Any]



def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


ViewMeta = Callable[[Sequence[Any]], tuple[Any, Any, Any]]


def view_evaluators(sig: GraphSignature) -> tuple[ViewMeta | None, ...]:
    """Per output, a function of the call's arguments giving a view's (size, stride, offset) when they
    were symbolic at trace time (None otherwise)."""
    return tuple(size_evaluator((o.size, o.stride, o.storage_offset), sig.symbols) if o.symbolic else None
                 for o in sig.outputs)


def finish_outputs(sig: GraphSignature, args: Sequence[Any], graph_outs: Sequence[Any],
                   mutated: Sequence[Any], views: Sequence[ViewMeta | None] = ()) -> Any:
    """Write mutated inputs back, then assemble the user's outputs (regenerating aliases; ``views``
    from ``view_evaluators`` for aliases with symbolic sizes)."""
    if mutated:
        dsts, news = [], []
        for idx, new in zip(sig.mutated_inputs, mutated):
            dst = args[idx]
            # a compiler that updated the input in place (kiln.inductor's reinplacing) returns it,
            # or a view of the same memory from a CUDA graph: nothing to copy
            if new is not dst and (new.data_ptr() != dst.data_ptr() or new.stride() != dst.stride()
                                   or new.shape != dst.shape):
                dsts.append(dst)
                news.append(new)
        if dsts:
            _write_back(dsts, news)
    result: list[Any] = []
    for i, info in enumerate(sig.outputs):
        k = info.kind
        if k is OutputKind.GRAPH:
            v = graph_outs[info.index]
        elif k is OutputKind.INPUT:
            v = args[info.index]
        elif k is OutputKind.SAME:
            v = result[info.index]
        elif k is OutputKind.CONSTANT:
            v = info.value
        else:
            base = args[info.index] if k is OutputKind.ALIAS_INPUT else result[info.index]
            meta = views[i] if i < len(views) else None
            v = base.as_strided(*meta(args)) if meta is not None else \
                base.as_strided(info.size, info.stride, info.storage_offset)  # type: ignore[arg-type]
            if not info.requires_grad and v.requires_grad:
                v = v.detach()
        result.append(v)
    return tree_unflatten(result, sig.out_spec)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def _write_back(dsts: list[torch.Tensor], news: list[torch.Tensor]) -> None:
    """``dst.copy_(new)`` for each pair, as one multi-tensor copy (a ResNet-50 training step updates 159
    BatchNorm buffers: 159 copies cost ~1.7 ms of host time per step). torch's foreach copy takes
    mixed dtypes and devices itself (pair by pair), so nothing is checked here on every call."""
    with torch.no_grad():
        if _FOREACH_COPY is not None:
            _FOREACH_COPY(dsts, news)
            return
        for dst, new in zip(dsts, news):
            dst.copy_(new)


def owned_call(compiled: Any) -> Callable[[list], Any] | None:
    """The compiled graph's entry that takes the caller's references over (``call_owned(list)``:
    kiln.inductor's wrappers), or None."""
    fn = getattr(compiled, "fn", compiled)
    return getattr(fn, "call_owned", None)


def release_saved(ctx: Any) -> bool:
    """Drop ``ctx``'s references to its saved tensors unless the graph is kept (retain_graph); True when
    they were dropped, so the caller holds the only references left."""
    clear = getattr(ctx, "maybe_clear_saved_tensors", None)
    if clear is None:
        return False
    clear()
    try:
        ctx.saved_tensors  # noqa: B018 - raises once autograd has freed them
    except RuntimeError:
        return True
    return False


def make_inference_callable(sig: GraphSignature, compiled: Compiled) -> Callable[..., Any]:
    n_out = sig.n_graph_outputs
    views = view_evaluators(sig)

    def run(*args: Any) -> Any:
        with autocast_off():
            outs = _as_list(compiled(*args))
        return finish_outputs(sig, args, outs[:n_out], outs[n_out:], views)
    return run


_DOUBLE_BACKWARD = (
    "kiln.autograd: a gradient computed by a compiled graph's backward (create_graph=True) was "
    "differentiated again (double backward, e.g. a gradient penalty or Hessian-vector product). "
    "Compiled backward graphs are not differentiable; compute higher-order gradients outside the "
    "compiled region or run this model eagerly.")


def undefined_gradients(grad_deps: Sequence[Sequence[int]], missing: set[int]) -> list[int]:
    """Positions of the gradients that read only tangents in ``missing`` (autograd passed None for
    them): zero by linearity, and None in eager, which never reaches their inputs."""
    return [k for k, deps in enumerate(grad_deps) if all(j in missing for j in deps)]


def make_training_callable(sig: GraphSignature, fw: Compiled, bw: Compiled, n_saved: int,
                           grad_deps: Sequence[Sequence[int]] | None = None,
                           n_saved_sizes: int = 0) -> Callable[..., Any]:
    """``grad_deps``: per gradient of the backward, the tangents it is computed from
    (``partition.tangent_dependencies``); a gradient whose tangents were all undefined is None.
    ``n_saved_sizes``: the forward's last outputs are that many ints (symbolic sizes), which the
    backward takes after the saved tensors."""
    n_out, n_mut = sig.n_graph_outputs, len(sig.mutated_inputs)
    diff = sig.graph_output_differentiable
    grad_inputs = sig.grad_inputs
    owned = owned_call(bw)

    class CompiledBackward(torch.autograd.Function):
        """The compiled backward run with create_graph=True: its results are gradients that can be
        read, but differentiating them again (double backward) raises DoubleBackwardError."""

        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:  # type: ignore[override]
            with autocast_off():
                return tuple(_as_list(bw(*args)))

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
            raise DoubleBackwardError(_DOUBLE_BACKWARD)

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:  # type: ignore[override]
            with autocast_off():
                outs = _as_list(fw(*args))
            end = len(outs) - n_saved_sizes
            ctx.save_for_backward(*outs[n_out + n_mut:end])
            ctx.saved_sizes = outs[end:]
            nondiff = [o for o, d in zip(outs[:n_out], diff) if not d and isinstance(o, torch.Tensor)]
            nondiff += outs[n_out:n_out + n_mut]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            # autograd would otherwise allocate and fill a zero gradient for every output nobody
            # differentiated, mutated buffers included (ResNet-50: 159 BatchNorm statistics per step)
            ctx.set_materialize_grads(False)
            ctx.tangent_meta = [(o.shape, o.dtype, o.device) for o, d in zip(outs[:n_out], diff) if d]
            return tuple(outs[:n_out + n_mut])

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
            given = [g for g, d in zip(grads[:n_out], diff) if d]
            missing = {j for j, g in enumerate(given) if g is None}
            tangents = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g.contiguous()
                        for g, (shape, dtype, device) in zip(given, ctx.tangent_meta)]
            if torch.is_grad_enabled():  # create_graph=True: first-order grads, no second order
                gin = list(CompiledBackward.apply(*ctx.saved_tensors, *ctx.saved_sizes, *tangents))
            elif owned is not None:
                # hand the saved activations over: the compiled backward drops each after its last
                # use, as eager's engine frees a node's saved tensors once it ran (unless retain_graph)
                bw_args = [*ctx.saved_tensors, *ctx.saved_sizes, *tangents]
                handed_over = release_saved(ctx)
                del tangents, given
                with autocast_off():  # retain_graph: autograd keeps them, so they are not the callee's
                    gin = _as_list(owned(bw_args) if handed_over else bw(*bw_args))
            else:
                with autocast_off():
                    gin = _as_list(bw(*ctx.saved_tensors, *ctx.saved_sizes, *tangents))
            if missing and grad_deps is not None:
                for k in undefined_gradients(grad_deps, missing):
                    gin[k] = None
            result: list[Any] = [None] * sig.n_inputs
            for idx, g in zip(grad_inputs, gin):
                result[idx] = g
            return tuple(result)

    views = view_evaluators(sig)

    def run(*args: Any) -> Any:
        outs = CompiledFunction.apply(*args)
        return finish_outputs(sig, args, outs[:n_out], outs[n_out:], views)
    run.autograd_function = CompiledFunction  # type: ignore[attr-defined]
    return run
