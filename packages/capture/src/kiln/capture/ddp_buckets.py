"""The graph of a DDP-wrapped forward split at gradient-bucket boundaries, each piece compiled alone.

Note: DDP all-reduces a bucket of gradients as soon as every gradient in it is accumulated. A forward
compiled as one graph has one backward node that produces every gradient at once, at its very end, so
no all-reduce could overlap the backward. Split into pieces holding about one bucket of parameters
each (in reverse, as DDP fills buckets from the last parameters), the backward runs piece by piece
from the last: the gradients of a piece's parameters are final, and their bucket's all-reduce starts,
while the earlier pieces' backwards still compute (what torch.compile's DDPOptimizer does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from kiln.graph import CompiledFn, ExampleInput, enabled, log


def bucket_plan(gm: fx.GraphModule, example_inputs: Sequence[Any], cap_bytes: int) -> dict[fx.Node, int]:
    """Partition ids for the graph's nodes: walking backwards, a new partition starts once the
    parameters first used by the current one exceed ``cap_bytes``. Partition 0 runs first."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_bytes = {n: v.numel() * v.element_size() for n, v in zip(placeholders, example_inputs)
                   if isinstance(v, nn.Parameter) and v.requires_grad}
    reverse_ids: dict[fx.Node, int] = {}
    current, size = 0, 0
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("placeholder", "output"):
            continue
        new = sum(param_bytes.get(a, 0) for a in node.all_input_nodes
                  if isinstance(a, fx.Node) and a in param_bytes and a not in reverse_ids)
        if size and size + new > cap_bytes:
            current, size = current + 1, 0
        size += new
        reverse_ids[node] = current
        for a in node.all_input_nodes:
            if a in param_bytes:
                reverse_ids.setdefault(a, current)
    last = current
    return {n: last - i for n, i in reverse_ids.items() if n.op != "placeholder"}


def bucket_split_backend(backend: Callable, cap_bytes: int, owner: str) -> Callable:
    """``backend`` applied to each bucket-sized piece of the graph (one piece: the graph as is)."""
    def split_backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        plan = bucket_plan(gm, example_inputs, cap_bytes)
        pieces = len(set(plan.values()))
        if pieces <= 1 or not torch.is_grad_enabled():
            return backend(gm, example_inputs)
        split = split_module(gm, gm, lambda n: plan[n], keep_original_order=True)
        inputs = _piece_inputs(split, example_inputs)
        for name, sub_inputs in inputs.items():
            sub = getattr(split, name)
            compiled = backend(sub, sub_inputs)
            setattr(split, name, _Compiled(compiled))
        if enabled("distributed"):
            log("distributed").info("%s: forward graph split into %d pieces at DDP bucket boundaries "
                                    "(%.1f MB per bucket); parameters per piece: %s", owner, pieces,
                                    cap_bytes / 2**20, _param_counts(gm, example_inputs, plan))
        return split.forward
    return split_backend


class _Compiled(nn.Module):
    """A compiled piece standing in for its submodule in the split graph."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _piece_inputs(split: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, list[Any]]:
    """Each piece's example inputs, recorded by running the split graph once (activations detached,
    keeping whether they require grad, so each piece compiles as a training graph)."""
    seen: dict[str, list[Any]] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            seen[str(target)] = [a.detach().requires_grad_(a.requires_grad)
                                 if isinstance(a, torch.Tensor) and not isinstance(a, nn.Parameter) else a
                                 for a in args]
            return super().call_module(target, args, kwargs)

    Recorder(split).run(*example_inputs)
    return seen


def _param_counts(gm: fx.GraphModule, example_inputs: Sequence[Any], plan: dict[fx.Node, int]) -> list[int]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    counts: dict[int, int] = {}
    for n, v in zip(placeholders, example_inputs):
        if isinstance(v, nn.Parameter):
            users = [plan[u] for u in n.users if u in plan]
            if users:
                counts[min(users)] = counts.get(min(users), 0) + 1
    return [counts.get(i, 0) for i in range(max(plan.values()) + 1)]


__all__ = ["bucket_plan", "bucket_split_backend"]
