"""inductor_backend: kiln.inductor behind PyTorch's compile() backend contract, standalone.

kiln's own pipeline hands compile_graph functional ATen graphs (capture -> autograd -> decomp). A
PyTorch compile() front end hands a backend torch-level graphs instead; this module records such a graph's
ATen calls on fake tensors with kiln.decomp's recorder, rewriting in-place ops to their functional
forms (SSA), and compiles the result. It handles inference graphs; a graph that mutates its inputs or views, or needs gradients,
runs as is, with the reason in perf_hints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from kiln.decomp import DecompositionError, trace
from kiln.graph import CompiledFn, Dialect, ExampleInput, VerificationError, log, verify

from .compile import compile_graph
from .options import DEFAULT_OPTIONS, InductorOptions


class FrontendUnsupported(Exception):
    pass


def to_aten(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """Record the ATen calls of ``gm`` on fake copies of ``example_inputs`` (functional, flat outputs)
    with kiln.decomp's recorder (the one ATen recorder kiln's stages share); raises
    DecompositionError for what it cannot functionalize (a write to an input or a view)."""
    def flat(*args: Any) -> tuple[Any, ...]:
        return tuple(tree_flatten(gm(*args))[0])
    with torch.no_grad():
        return trace(flat, example_inputs, functionalize=True, scalar_inputs=True)


def inductor_backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput],
                     options: InductorOptions = DEFAULT_OPTIONS) -> CompiledFn:
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
        except (FrontendUnsupported, DecompositionError) as e:
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
