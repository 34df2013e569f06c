"""Dependency analysis over a LoopProgram: who reads which buffer, and dead-code elimination."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from ..ir import ExternKernel, LoopProgram, Node, TensorRef, node_outputs, node_reads


@dataclass
class Dependencies:
    producer: dict[str, int] = field(default_factory=dict)  # buffer -> index of the node writing it
    readers: dict[str, list[int]] = field(default_factory=dict)  # buffer -> indices of nodes reading it
    outputs: set[str] = field(default_factory=set)  # buffers returned by the graph


def analyze(p: LoopProgram) -> Dependencies:
    deps = Dependencies()
    for k, n in enumerate(p.nodes):
        for b in node_outputs(n):
            deps.producer[b] = k
        for b in node_reads(n):
            deps.readers.setdefault(b, []).append(k)
    deps.outputs = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    return deps


def eliminate_dead_code(p: LoopProgram) -> LoopProgram:
    """Drop nodes none of whose outputs reach the graph outputs (the graph is functional), except the
    calls that must run all the same (``runs_for_effect``)."""
    live: set[str] = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    kept: list[Node] = []
    for n in reversed(p.nodes):
        if any(b in live for b in node_outputs(n)) or runs_for_effect(n):
            kept.append(n)
            live.update(node_reads(n))
    if len(kept) == len(p.nodes):
        return p
    return dataclasses.replace(p, nodes=tuple(reversed(kept)))


def runs_for_effect(n: Node) -> bool:
    """An ATen call kept though nothing reads its result: a random op (``uniform_``, ``randperm``,
    ``multinomial``... run through ATen) advances the generator it draws from, and eager's later draws
    depend on where it left it (``torch.empty(8).uniform_().fill_(0)`` draws 8 numbers in eager)."""
    return isinstance(n, ExternKernel) and _seeded(n.target)


@functools.cache
def _seeded(target: str) -> bool:
    ns, _, rest = target.partition(".")
    name, _, overload = rest.partition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    except (AttributeError, RuntimeError):
        return False
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags
