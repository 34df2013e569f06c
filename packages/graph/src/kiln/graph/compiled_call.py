"""Running compiled forward/backward graphs as the caller's function: the one implementation.

kiln.autograd wraps the graphs it compiles in-process with it, and kiln.runtime wraps the graphs of a
loaded program with it, so both behave alike (an artifact trains as the process that saved it did).
Training: an ``autograd.Function`` whose forward runs the compiled forward graph and saves what the
partition chose, and whose backward runs the compiled backward graph. Inference: the forward alone.
Both then write mutated inputs back with ``copy_`` and rebuild outputs that alias inputs or other
outputs as views, so callers see eager's aliasing.

Compiled graphs are called with a list of arguments (``ListCall``); a backward given as ``bw_owned``
takes the list's references over and frees saved activations after their last use.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_unflatten

from .errors import DoubleBackwardError
from .modes import autocast_off
from .symbolic import size_evaluator

ListCall = Callable[[list[Any]], Sequence[Any]]

OUTPUT_KINDS = ("graph", "input", "alias_input", "alias_output", "same", "constant", "symbolic")


@dataclass(frozen=True, slots=True)
class OutputRule:
    """How to make one of the caller's outputs: ``kind`` (OUTPUT_KINDS) says from what, ``index``
    which graph output, input or earlier output; views are rebuilt with ``as_strided``."""

    kind: str
    index: int = -1
    # a view's metadata; a str is a symbolic size as a Python expression over CallSignature.symbols
    size: tuple[int | str, ...] = ()
    stride: tuple[int | str, ...] = ()
    storage_offset: int | str = 0
    requires_grad: bool = False
    value: Any = None  # a constant output (int, None, ...); a "symbolic" output's Python expression

    @property
    def symbolic(self) -> bool:
        return any(isinstance(v, str) for v in (*self.size, *self.stride, self.storage_offset))


@dataclass(frozen=True, slots=True)
class CallSignature:
    """What the wrapper needs of a traced graph. The forward returns ``n_out`` graph outputs, then
    the new values of the ``mutated`` inputs, then (training) the tensors saved for the backward;
    the backward takes the saved tensors and one tangent per ``diff`` output and returns one
    gradient per ``grad_inputs`` entry. ``grad_deps``: per gradient, the tangents it reads (a
    gradient whose tangents were all undefined is None, as in eager), ``NO_GRADIENT`` where no
    output depends on the input. Symbolic graphs: the forward's
    last ``n_saved_sizes`` outputs are ints (sizes the backward needs, passed after the saved
    tensors), and ``symbols`` says where each size symbol is read at run time: (name, input index,
    dim, or -1 for an int input)."""

    n_inputs: int
    n_out: int
    mutated: tuple[int, ...]
    diff: tuple[bool, ...]
    grad_inputs: tuple[int, ...]
    outputs: tuple[OutputRule, ...]
    out_spec: TreeSpec
    grad_deps: tuple[tuple[int, ...], ...] | None = None
    n_saved_sizes: int = 0
    symbols: tuple[tuple[str, int, int], ...] = ()

    @staticmethod
    def from_json(sig: Mapping[str, Any], out_spec: TreeSpec) -> CallSignature:
        """From the JSON form saved programs carry (kiln.autograd's portable.py writes it)."""
        deps = sig.get("grad_deps")  # absent in programs saved before it was recorded
        return CallSignature(
            sig["n_inputs"], sig["n_out"], tuple(sig["mutated"]), tuple(sig["diff"]), tuple(sig["grad_inputs"]),
            tuple(OutputRule(k, i, tuple(size), tuple(stride), off, rg, v)
                  for k, i, size, stride, off, rg, v in sig["outputs"]),
            out_spec, None if deps is None else tuple(tuple(d) for d in deps),
            sig.get("n_saved_sizes", 0), tuple((n, i, d) for n, i, d in sig.get("symbols", ())))


ViewMeta = Callable[[Sequence[Any]], Any]  # (size, stride, offset) of a view, or a symbolic number


def view_evaluators(sig: CallSignature) -> tuple[ViewMeta | None, ...]:
    """Per output, a function of the call's arguments giving a view's (size, stride, offset) when they
    were symbolic at trace time, or a "symbolic" output's number (None otherwise)."""
    return tuple(size_evaluator(r.value, sig.symbols) if r.kind == "symbolic" else
                 size_evaluator((r.size, r.stride, r.storage_offset), sig.symbols) if r.symbolic else None
                 for r in sig.outputs)


def finish_outputs(sig: CallSignature, args: Sequence[Any], graph_outs: Sequence[Any],
                   mutated: Sequence[Any], views: Sequence[ViewMeta | None] = ()) -> Any:
    """Write mutated inputs back, then assemble the user's outputs (regenerating aliases; ``views``
    from ``view_evaluators`` for aliases with symbolic sizes)."""
    if mutated:
        targets = [args[idx] for idx in sig.mutated]
        if all(map(operator.is_, mutated, targets)):  # the usual case: kiln.inductor wrote each in place
            written = targets
        else:
            dsts, news, written = [], [], []
            for dst, new in zip(targets, mutated):
                # a compiler that updated the input in place (kiln.inductor's reinplacing) returns it,
                # or a view of the same memory from a CUDA graph: nothing to copy
                if new is not dst and (new.data_ptr() != dst.data_ptr() or new.stride() != dst.stride()
                                       or new.shape != dst.shape):
                    dsts.append(dst)
                    news.append(new)
                else:
                    written.append(dst)
            if dsts:
                _write_back(dsts, news)
        if written:
            # a kernel wrote them through their pointers: their version counters move as eager's
            # in-place ops move them, so a backward that saved the old values refuses to run
            _increment_version(written)
    result: list[Any] = []
    for i, rule in enumerate(sig.outputs):
        k = rule.kind
        if k == "graph":
            v = graph_outs[rule.index]
            if rule.requires_grad and not v.requires_grad:  # a leaf the graph made (``torch.ones(3).requires_grad_()``)
                v.requires_grad_()
        elif k == "input":
            v = args[rule.index]
        elif k == "same":
            v = result[rule.index]
        elif k == "constant":
            v = rule.value
        elif k == "symbolic":
            v = views[i](args)  # type: ignore[misc]  # view_evaluators made one for every "symbolic" rule
        else:
            base = args[rule.index] if k == "alias_input" else result[rule.index]
            meta = views[i] if i < len(views) else None
            v = base.as_strided(*meta(args)) if meta is not None else \
                base.as_strided(rule.size, rule.stride, rule.storage_offset)  # type: ignore[arg-type]
            if not rule.requires_grad and v.requires_grad:
                v = v.detach()
        result.append(v)
    return tree_unflatten(result, sig.out_spec)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)
_increment_version = torch.autograd.graph.increment_version


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


NO_GRADIENT = (-1,)  # the ``grad_deps`` of a gradient the backward never computes (no output depends on its input)


def undefined_gradients(grad_deps: Sequence[Sequence[int]], missing: set[int]) -> list[int]:
    """Positions of the gradients that read only tangents in ``missing`` (autograd passed None for
    them): zero by linearity, and None in eager, which never reaches their inputs."""
    return [k for k, deps in enumerate(grad_deps) if all(j in missing for j in deps)]


DOUBLE_BACKWARD = (
    "kiln: a gradient computed by a compiled graph's backward (create_graph=True) was "
    "differentiated again (double backward, e.g. a gradient penalty or Hessian-vector product). "
    "Compiled backward graphs are not differentiable; compute higher-order gradients outside the "
    "compiled region or run this model eagerly.")


def inference_call(sig: CallSignature, fw: ListCall) -> Callable[[list[Any]], Any]:
    """``call(args)``: the forward graph, then write-back and output rebuilding. ``sig.diff`` outputs
    (a forward graph has them when they depend on leaves the graph made) require grad."""
    n_out = sig.n_out
    views = view_evaluators(sig)
    if any(sig.diff):
        return _in_graph_leaves_call(sig, fw, views)

    def call(args: list[Any]) -> Any:
        # no output is differentiable: an ATen call of the graph (mm, conv) given an input that requires
        # grad must not record autograd history (its output required grad where eager's, made under
        # no_grad, did not, and it kept the saved tensors alive)
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            with autocast_off():
                outs = list(fw(list(args)))
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        return finish_outputs(sig, args, outs[:n_out], outs[n_out:], views)
    return call


def _in_graph_leaves_call(sig: CallSignature, fw: ListCall,
                          views: Sequence[ViewMeta | None]) -> Callable[[list[Any]], Any]:
    """Note: outputs that depend on leaves made inside the graph (the parameters of a module built in
    compiled code, ``torch.ones(3, requires_grad=True)``) while no input requires grad. In eager they
    require grad, and ``backward()`` through them accumulates gradients into those leaves only, which
    nothing outside the graph can reach (a module that outlives the graph is built in Python by
    kiln.capture): there is nothing for a backward to compute. So the forward graph runs inside an
    ``autograd.Function`` whose backward returns no gradients, given one throwaway leaf that requires
    grad (autograd makes a Function's outputs require grad only when one of its inputs does); the
    other outputs are marked non-differentiable, as eager's do not require grad."""
    n_out, n_mut, diff, n_inputs = sig.n_out, len(sig.mutated), sig.diff, sig.n_inputs

    class InGraphLeaves(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, anchor: torch.Tensor, *args: Any) -> Any:  # type: ignore[override]
            with autocast_off():
                outs = list(fw(list(args)))
            nondiff = [o for o, d in zip(outs[:n_out], diff) if not d and isinstance(o, torch.Tensor)]
            nondiff += outs[n_out:n_out + n_mut]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            return tuple(outs)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
            return (None,) * (1 + n_inputs)

    def call(args: list[Any]) -> Any:
        if not torch.is_grad_enabled():  # eager's ops under no_grad record nothing
            with autocast_off():
                outs = list(fw(list(args)))
        else:
            outs = list(InGraphLeaves.apply(torch.empty(0, requires_grad=True), *args))
        return finish_outputs(sig, args, outs[:n_out], outs[n_out:], views)
    return call


def training_function(sig: CallSignature, fw: ListCall, bw: ListCall,
                      bw_owned: ListCall | None = None) -> type[torch.autograd.Function]:
    """The ``autograd.Function`` running ``fw`` and, for its backward, ``bw`` (or ``bw_owned`` when
    the saved tensors could be handed over). With ``create_graph=True`` the backward gives the
    first-order gradients (as torch.compile does); differentiating those again raises
    DoubleBackwardError."""
    n_out, n_mut, diff = sig.n_out, len(sig.mutated), sig.diff
    grad_inputs, grad_deps, n_sizes = sig.grad_inputs, sig.grad_deps, sig.n_saved_sizes

    class CompiledBackward(torch.autograd.Function):
        """The compiled backward run with create_graph=True: its results are gradients that can be
        read, but differentiating them again (double backward) raises DoubleBackwardError."""

        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:  # type: ignore[override]
            with autocast_off():
                return tuple(bw(list(args)))

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
            raise DoubleBackwardError(DOUBLE_BACKWARD)

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:  # type: ignore[override]
            with autocast_off():
                outs = list(fw(list(args)))
            end = len(outs) - n_sizes
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
            else:
                bw_args = [*ctx.saved_tensors, *ctx.saved_sizes, *tangents]
                # hand the saved activations over: the compiled backward drops each after its last
                # use, as eager's engine frees a node's saved tensors once it ran (unless retain_graph)
                handed_over = bw_owned is not None and release_saved(ctx)
                del tangents, given
                with autocast_off():
                    gin = list(bw_owned(bw_args) if handed_over and bw_owned is not None else bw(bw_args))
            if missing and grad_deps is not None:
                for k in undefined_gradients(grad_deps, missing):
                    gin[k] = None
            result: list[Any] = [None] * sig.n_inputs
            for idx, g in zip(grad_inputs, gin):
                result[idx] = g
            return tuple(result)

    return CompiledFunction


def training_call(sig: CallSignature, fw: ListCall, bw: ListCall,
                  bw_owned: ListCall | None = None) -> tuple[Callable[[list[Any]], Any], type[torch.autograd.Function]]:
    """``call(args)`` running ``training_function``'s Function, then write-back and output
    rebuilding; and the Function (for inspection)."""
    function = training_function(sig, fw, bw, bw_owned)
    n_out = sig.n_out
    views = view_evaluators(sig)
    # inputs that require grad but no output depends on (a dead local a resume function takes, an unused
    # argument): given to the Function detached, so its backward does not reach their own autograd graph
    # (eager's never does: after that graph's backward, ours raised "backward through the graph a second
    # time"; before, it kept that graph alive)
    loose = tuple(i for i, deps in zip(sig.grad_inputs, sig.grad_deps or ()) if tuple(deps) == NO_GRADIENT)

    def call(args: list[Any]) -> Any:
        given = args
        if loose:
            given = list(args)
            for i in loose:
                if given[i].requires_grad:
                    given[i] = given[i].detach()
        outs = function.apply(*given)
        return finish_outputs(sig, args, outs[:n_out], outs[n_out:], views)
    return call, function
