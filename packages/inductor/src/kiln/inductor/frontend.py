"""inductor_backend: kiln.inductor behind PyTorch's compile() backend contract, standalone.

kiln's own pipeline hands compile_graph functional ATen graphs (capture -> autograd -> decomp). A
PyTorch compile() front end hands a backend torch-level graphs instead; this module records such a graph's
ATen calls on fake tensors, rewriting in-place ops to their functional forms (SSA), and compiles the
result. It handles inference graphs; a graph that mutates its inputs or views, or needs gradients,
runs as is, with the reason in perf_hints.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from kiln.graph import Dialect, VerificationError, log, verify

from .compile import compile_graph
from .options import DEFAULT_OPTIONS, InductorOptions


class FrontendUnsupported(Exception):
    pass


class _AtenRecorder(TorchDispatchMode):
    def __init__(self, graph: fx.Graph) -> None:
        super().__init__()
        self.graph = graph
        self.env: dict[int, fx.Node] = {}
        self.keep: list[torch.Tensor] = []
        self.inputs: set[int] = set()

    def bind(self, t: torch.Tensor, node: fx.Node) -> None:
        self.env[id(t)] = node
        self.keep.append(t)
        node.meta["val"] = t

    def node_of(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in self.env:  # a constant created outside the graph
                raise FrontendUnsupported("a tensor constant not passed as an input")
            return self.env[id(x)]
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        target = func
        mutated = [a for a, arg in zip(schema.arguments, args)
                   if a.alias_info is not None and a.alias_info.is_write]
        if mutated:
            self_t = args[0]
            if id(self_t) in self.inputs or getattr(self_t, "_base", None) is not None:
                raise FrontendUnsupported(f"{func} mutates a graph input or a view")
            name = schema.name.split("::")[-1].rstrip("_")
            packet = getattr(torch.ops.aten, name, None)
            target = getattr(packet, func._overloadname, None) if packet is not None else None
            if target is None or len(mutated) != 1:
                raise FrontendUnsupported(f"{func} has no functional form")
        out = func(*args, **kwargs)
        node = self.graph.call_function(target, tree_map(self.node_of, args), tree_map(self.node_of, kwargs))
        if isinstance(out, torch.Tensor):
            self.bind(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = out
            for k, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self.bind(o, self.graph.call_function(operator.getitem, (node, k)))
        return out


def to_aten(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """Record the ATen calls of ``gm`` on fake copies of ``example_inputs`` (functional, flat outputs)."""
    graph = fx.Graph()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    rec = _AtenRecorder(graph)
    fakes: list[Any] = []
    for k, x in enumerate(example_inputs):
        ph = graph.placeholder(f"arg{k}")
        if isinstance(x, torch.Tensor):
            f = fake_mode.from_tensor(x)
            rec.bind(f, ph)
            rec.inputs.add(id(f))
            fakes.append(f)
        else:
            ph.meta["val"] = x
            fakes.append(x)
    with torch.no_grad(), fake_mode, rec:
        out = gm(*fakes)
    flat, _ = tree_flatten(out)
    graph.output(tuple(rec.node_of(o) for o in flat))
    return fx.GraphModule(torch.nn.Module(), graph)


def inductor_backend(gm: fx.GraphModule, example_inputs: Sequence[Any],
                     options: InductorOptions = DEFAULT_OPTIONS) -> Callable[..., Any]:
    """``compile(f, backend=kiln.inductor.inductor_backend) in PyTorch``."""
    try:
        verify(gm, Dialect.ATEN)
        aten_gm = gm
    except VerificationError:
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
        try:
            if needs_grad:
                raise FrontendUnsupported("the graph needs gradients (use kiln.compile, which runs kiln.autograd)")
            aten_gm = to_aten(gm, example_inputs)
        except FrontendUnsupported as e:
            log("perf_hints").warning("kiln.inductor: running a graph uncompiled: %s", e)
            return gm.forward
    compiled = compile_graph(aten_gm, example_inputs, options=options)
    if isinstance(_example_output(gm), (tuple, list)):
        return compiled
    return replace(compiled, fn=_first_output(compiled.fn))


def _first_output(fn: Callable[..., tuple]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return fn(*args)[0]
    return run


def _example_output(gm: fx.GraphModule) -> Any:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return out.args[0]
