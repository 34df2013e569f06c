"""Ahead-of-time compilation: ``kiln.compile(fn, fullgraph=True).aot_compile(((args), {kwargs}))``.

capture (one whole graph) -> the chosen backend -> its PortableProgram -> a kiln.runtime Artifact.
The returned object is a ``kiln.runtime.LoadedFunction`` built from the in-memory artifact, so the
function you call right after compiling runs exactly what a later ``load_compiled_function`` runs.

Note: the captured graph returns a flat tuple; the function's own return structure is recovered by
running the function once eagerly on the example inputs and matching its tensor leaves to the graph's
outputs in order (checked value by value). Returns with non-tensor leaves are refused with a clear
error rather than guessed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.utils._pytree as pytree

import kiln.capture as capture
import kiln.runtime as runtime
from kiln.graph import Backend, BackendUnavailable, CompiledGraph, KilnError, PortableProgram
from kiln.settings import CompileOptions


def _frame(fn: Callable[..., Any], args: tuple, kwargs: dict) -> runtime.CallFrame:
    """The example call's frame as capture names it: arguments, closure variables by name, and
    ``L['__closure__']`` (capture's source for a cell of the function itself)."""
    frame = runtime.CallFrame.of(fn, args, kwargs)
    closure = getattr(inspect.unwrap(fn), "__closure__", None)
    if not closure:
        return frame
    return runtime.CallFrame(frame.params, {**frame.locals, "__closure__": closure}, frame.globals)


def _example_inputs(sources: tuple[str, ...], L: dict, G: dict) -> list[Any]:
    return [eval(src, {"L": L, "G": G}) for src in sources]  # noqa: S307 (capture's own sources)


def _output_spec(fn: Callable[..., Any], args: tuple, kwargs: dict,
                 graph_outputs: tuple) -> pytree.TreeSpec:
    with torch.no_grad():
        eager = fn(*args, **kwargs)
    leaves, spec = pytree.tree_flatten(eager)
    if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        kinds = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
        raise KilnError(f"aot_compile: {getattr(fn, '__qualname__', fn)} returns non-tensor values "
                        f"({', '.join(kinds)}); ahead-of-time functions must return tensors in "
                        "(nested) tuples, lists or dicts")
    if len(leaves) != len(graph_outputs) or not all(
            a.shape == b.shape and _close(a, b) for a, b in zip(leaves, graph_outputs)):
        raise KilnError(f"aot_compile: cannot match the {len(leaves)} returned tensors of "
                        f"{getattr(fn, '__qualname__', fn)} to the captured graph's "
                        f"{len(graph_outputs)} outputs (does it return an input or a view of one?)")
    return spec


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a returned tensor is this graph output: the same values up to the compiled code's
    rounding (16-bit products summed in another order differ by a few units of their last place;
    fp32 convolutions and matmuls on a GPU run in TF32, whose error grows with the values' scale:
    VGG-11's logits differed by 5e-4 of their largest)."""
    if a.dtype != b.dtype or a.numel() == 0:
        return a.dtype == b.dtype
    low = a.is_floating_point() and a.element_size() < 4
    a, b = a.detach().float(), b.detach().float()
    scale = float(a.abs().max()) if a.is_floating_point() else 0.0
    return torch.allclose(a, b, rtol=5e-2 if low else 1e-3, atol=5e-2 * (scale + 1) if low else 1e-4 + 1e-3 * scale,
                          equal_nan=True)


def _with_triton_binaries(program: PortableProgram) -> PortableProgram:
    """Ship the Triton kernels the run above compiled, so a load on the same GPU and triton release
    does not compile them again (other machines rebuild from the sources the wrapper carries)."""
    binaries = runtime.collect_triton_binaries(program.triton_modules)
    if not binaries:
        return program
    return replace(program, files={**program.files, **binaries})


def aot_compile(fn: Callable[..., Any], example: tuple[tuple[Any, ...], dict[str, Any]],
                opts: CompileOptions, backend: Backend) -> runtime.LoadedFunction:
    """Capture ``fn`` on ``example`` as one graph, compile it, and wrap it as a runtime function."""
    args, kwargs = tuple(example[0]), dict(example[1])
    captured = capture.capture_graph(fn, args, kwargs, dynamic=opts.dynamic)
    frame = _frame(fn, args, kwargs)
    inputs = _example_inputs(captured.input_sources, dict(frame.locals), dict(frame.globals))
    compiled = backend(captured.gm, inputs)
    # sizes marked dynamic stay symbolic in the artifact: its guards are the relations the capture and
    # the backend assumed (checked on every call of the loaded function)
    captured = capture.refresh_shape_guards(captured)
    program = compiled.portable if isinstance(compiled, CompiledGraph) else None
    if program is None:
        raise BackendUnavailable(
            f"aot_compile: backend {opts.backend!r} gave no portable program, so the result could "
            "not be saved; use backend 'eager', 'aot_eager' or 'inductor'")
    with torch.no_grad():
        graph_outputs = tuple(compiled(*inputs))
    spec = _output_spec(fn, args, kwargs, graph_outputs)
    program = _with_triton_binaries(program)
    artifact = runtime.build_artifact(
        program, input_sources=captured.input_sources, input_specs=captured.input_specs,
        guards=captured.guards, frame=frame, output_spec=spec, backend=opts.backend,
        metadata={"function": getattr(fn, "__qualname__", repr(fn)),
                  "signature": str(inspect.signature(fn)), "mode": opts.mode})
    return runtime.load_compiled_function(artifact)
