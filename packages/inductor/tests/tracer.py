"""A test-only tracer: run a function under a TorchDispatchMode and record its ATen calls in an fx graph."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: fx.Graph) -> None:
        super().__init__()
        self.graph = graph
        self.env: dict[int, fx.Node] = {}
        self.keep: list[torch.Tensor] = []

    def bind(self, t: torch.Tensor, node: fx.Node) -> None:
        self.env[id(t)] = node
        self.keep.append(t)
        node.meta["val"] = t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)

        def to_node(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                if id(x) not in self.env:
                    raise RuntimeError(f"tensor not produced inside the trace fed {func}; pass it as an input")
                return self.env[id(x)]
            return x
        node = self.graph.call_function(func, tree_map(to_node, args), tree_map(to_node, kwargs))
        if isinstance(out, torch.Tensor):
            self.bind(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = out
            for k, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, k))
                    self.bind(o, g)
        return out


def flat_outputs(out: Any) -> list[Any]:
    """Outputs as a flat list (nested tuples and return_types flattened)."""
    if isinstance(out, (tuple, list)):
        return [y for x in out for y in flat_outputs(x)]
    return [out]


def trace(fn: Callable[..., Any], *inputs: torch.Tensor) -> fx.GraphModule:
    """ATen graph of ``fn(*inputs)``; outputs flattened into a tuple."""
    graph = fx.Graph()
    rec = _Recorder(graph)
    ins = []
    for k, x in enumerate(inputs):
        ph = graph.placeholder(f"arg{k}")
        x2 = x.detach().clone() if isinstance(x, torch.Tensor) else x
        if isinstance(x, torch.Tensor):
            x2 = x.detach()
            rec.bind(x2, ph)
        ins.append(x2)
    with torch.no_grad(), rec:
        out = fn(*ins)
    outs = flat_outputs(out)
    graph.output(tuple(rec.env[id(o)] if isinstance(o, torch.Tensor) else o for o in outs))
    return fx.GraphModule(torch.nn.Module(), graph)
