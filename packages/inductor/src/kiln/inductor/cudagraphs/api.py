"""The entry points the inductor backend and the meta-package use for mode="reduce-overhead"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..size_buckets import BucketedCall
from .function import CUDAGraphFunction, default_tree
from .options import CUDAGraphOptions
from .tree import CUDAGraphTree


def cudagraphify(fn: Callable[..., Any], example_inputs: Sequence[Any], *,
                 static_input_indices: Sequence[int] = (), tree: CUDAGraphTree | None = None,
                 options: CUDAGraphOptions | None = None, name: str | None = None,
                 written_inputs: Sequence[int] = ()) -> CUDAGraphFunction:
    """Wrap ``fn`` (called as ``fn(*flat_args)``) so its calls replay CUDA graphs in ``tree``.

    ``static_input_indices`` are the arguments read in place (parameters, buffers): they are not
    copied, and a replay requires them at the same address. ``tree`` defaults to the device's shared
    tree, so the forward and backward of a training step, or the graphs around a graph break, share one
    pool. When the example inputs rule graphs out (CPU tensors), the wrapper runs ``fn`` as is and the
    reason is in the ``cudagraphs`` log.
    """
    device = _device_of(example_inputs, tree)
    if tree is None:
        tree = default_tree(device) if device.type == "cuda" else CUDAGraphTree(device)
    func = CUDAGraphFunction(fn, static_input_indices=static_input_indices, tree=tree, options=options,
                             name=name, written_inputs=written_inputs)
    if device.type != tree.engine.device_type:
        func.skip(f"its inputs are on {device}; CUDA graphs need {tree.engine.device_type} tensors")
    elif device.type == "cuda" and not torch.cuda.is_available():
        func.skip("CUDA is not available in this process")
    return func


def wrap_reduce_overhead(compiled_fn: Callable[..., Any], example_inputs: Sequence[Any],
                         static_input_indices: Sequence[int], *, tree: CUDAGraphTree | None = None,
                         options: CUDAGraphOptions | None = None,
                         written_inputs: Sequence[int] = ()) -> Callable[..., Any]:
    """How a backend applies mode="reduce-overhead" to one compiled graph (forward, backward, or a piece
    of a graph break): the result has the compiled graph's calling convention. A graph with size buckets
    (``InductorOptions.cudagraph_sizes``, size_buckets.py) pads before the CUDA graphs see its inputs, so
    they are recorded per bucket. ``written_inputs``: the inputs the compiled graph writes in place (graphed
    at their own address, as parameters are)."""
    if isinstance(compiled_fn, BucketedCall):
        inner = cudagraphify(compiled_fn.fn, example_inputs, static_input_indices=static_input_indices, tree=tree,
                             options=options, name=getattr(compiled_fn.fn, "__name__", None),
                             written_inputs=written_inputs)
        return BucketedCall(inner, compiled_fn.plan)
    return cudagraphify(compiled_fn, example_inputs, static_input_indices=static_input_indices, tree=tree,
                        options=options, name=getattr(compiled_fn, "__name__", None), written_inputs=written_inputs)


def _device_of(example_inputs: Sequence[Any], tree: CUDAGraphTree | None) -> torch.device:
    devices = [a.device for a in example_inputs if isinstance(a, torch.Tensor)]
    for d in devices:
        if d.type != "cpu":
            return d if d.index is not None or d.type != "cuda" else torch.device("cuda", 0)
    if devices:
        return devices[0]
    return tree.device if tree is not None else torch.device("cuda", 0)
