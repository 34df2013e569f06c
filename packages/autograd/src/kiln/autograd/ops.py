"""What the tracer and partitioner need to know about ATen operators, read from their schemas.

- views: an op whose returns alias an argument without writing it (``Tensor(a)``), and how to invert one
  (scatter a new view value back into its base);
- mutations: in-place (``add_``), ``out=`` and schema-declared (``Tensor(a!)``) writes, and the functional
  overload computing the same value;
- cost classes for the min-cut partitioner: cheap ops that may be recomputed in the backward, and random
  ops that must never be (the backward must see the forward's mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload


@dataclass(frozen=True, slots=True)
class Mutation:
    """How to run a mutating op functionally: ``functional`` computes the values written into ``targets``.

    ``targets`` are argument names; ``result_for`` gives, per target, the index of the functional op's
    output holding its new value (None: the functional op returns a single tensor).
    """

    functional: OpOverload
    targets: tuple[str, ...]
    result_for: tuple[int | None, ...]
    drop_args: tuple[str, ...] = ()  # out= arguments the functional op does not take


def _arg_sig(a: torch._C.Argument) -> tuple[str, str]:
    return (a.name, str(a.type))


@cache  # asked for every traced op: reading a schema's alias info costs more than the lookup
def mutated_args(op: OpOverload) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def is_view(op: OpOverload) -> bool:
    """True when the op's outputs alias its first argument (a view), without writing it."""
    return isinstance(op, OpOverload) and _is_view_op(op)


@cache
def _is_view_op(op: OpOverload) -> bool:
    if mutated_args(op):
        return False
    rets = op._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


# In-place ops whose functional twin has another name (not found by the name rule).
_RENAMED: dict[str, str] = {
    "normal_": "normal_functional",
    "__ilshift__": "__lshift__", "__irshift__": "__rshift__",
    "__iand__": "__and__", "__ior__": "__or__", "__ixor__": "__xor__",
}

# Ops that mutate with no trailing underscore and no out=: handled one by one.
_SPECIAL: dict[OpOverload, Mutation] = {
    aten._native_batch_norm_legit.default: Mutation(
        aten._native_batch_norm_legit_functional.default, ("running_mean", "running_var"), (3, 4)),
    aten._batch_norm_with_update.default: Mutation(
        aten._batch_norm_with_update_functional.default, ("running_mean", "running_var"), (4, 5)),
}

# Ops that change a tensor's metadata in place; replayed as the out-of-place view.
INPLACE_VIEWS: dict[OpOverload, OpOverload] = {
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.as_strided_.default: aten.as_strided.default,
}


def _match(packet: torch._ops.OpOverloadPacket, want: list[tuple[str, str]]) -> OpOverload | None:
    for name in packet.overloads():
        cand = getattr(packet, name)
        if mutated_args(cand):
            continue
        if [_arg_sig(a) for a in cand._schema.arguments] == want:
            return cand
    return None


@cache
def mutation_of(op: OpOverload) -> Mutation | None:
    """The functional rewrite of a mutating op, or None when the op does not mutate."""
    if op in _SPECIAL:
        return _SPECIAL[op]
    written = mutated_args(op)
    if not written or op in INPLACE_VIEWS:
        return None
    schema = op._schema
    base = schema.name.split("::")[-1]
    outs = [a for a in schema.arguments if a.is_out]
    if outs:  # out= variant: the functional overload takes the other arguments
        keep = [_arg_sig(a) for a in schema.arguments if not a.is_out]
        fop = _match(getattr(aten, base), keep)
        if fop is not None:
            n = len(outs)
            return Mutation(fop, tuple(a.name for a in outs), tuple(range(n)) if n > 1 else (None,),
                            tuple(a.name for a in outs))
        return None
    fname = _RENAMED.get(base) or (base[:-1] if base.endswith("_") else None)
    if fname is None or not hasattr(aten, fname) or written != (schema.arguments[0].name,):
        return None
    packet = getattr(aten, fname)
    want = [_arg_sig(a) for a in schema.arguments]
    fop = _match(packet, want)
    if fop is None:  # e.g. bernoulli_.float(p=0.5) vs bernoulli.p(p): names/types agree, defaults differ
        same = getattr(packet, op._overloadname, None)
        if same is not None and not mutated_args(same) and \
                [a.name for a in same._schema.arguments] == [a.name for a in schema.arguments]:
            fop = same
    if fop is None:
        fop = _match_loose(packet, [a.name for a in schema.arguments])
    return None if fop is None else Mutation(fop, written, (None,))


def _match_loose(packet: torch._ops.OpOverloadPacket, names: list[str]) -> OpOverload | None:
    for name in packet.overloads():
        cand = getattr(packet, name)
        if not mutated_args(cand) and [a.name for a in cand._schema.arguments] == names:
            return cand
    return None


# ---- cost classes for partitioning -------------------------------------------------------------

_RANDOM_NAMES = {
    "bernoulli", "native_dropout", "normal", "normal_functional", "uniform", "rand", "rand_like",
    "randn", "randn_like", "randint", "randint_like", "randperm", "multinomial", "exponential",
    "geometric", "cauchy", "log_normal", "random", "poisson", "_fused_dropout", "rrelu_with_noise",
    "_standard_gamma", "binomial",
}

_CHEAP_NAMES = {
    "_to_copy", "clone", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty",
    "empty_like", "arange", "scalar_tensor", "where", "fill", "lift_fresh_copy", "_unsafe_view",
    "masked_fill", "clamp", "clamp_min", "clamp_max", "copy", "alias", "detach",
    "slice_scatter", "select_scatter", "expand_copy", "view_copy", "permute_copy", "cat",
    "constant_pad_nd",
}


def op_name(op: OpOverload) -> str:
    return op._schema.name.split("::")[-1]


def is_random(op: object) -> bool:
    return isinstance(op, OpOverload) and (op_name(op) in _RANDOM_NAMES or torch.Tag.nondeterministic_seeded in op.tags)


def is_recomputable(op: object) -> bool:
    """Cheap ops the backward may recompute: pointwise math, views, casts and factories.

    Matmuls, convolutions, attention, reductions and random ops are never recomputed (cost or
    correctness: a recomputed dropout would draw a new mask).
    """
    if not isinstance(op, OpOverload) or is_random(op):
        return False
    if is_view(op) or op_name(op) in _CHEAP_NAMES:
        return True
    return torch.Tag.pointwise in op.tags
