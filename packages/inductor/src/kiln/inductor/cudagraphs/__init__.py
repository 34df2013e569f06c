"""kiln's CUDA graph trees (mode="reduce-overhead").

``cudagraphify(fn, example_inputs, static_input_indices=..., tree=None, options=None)`` wraps any
compiled callable; ``wrap_reduce_overhead`` is the form the backends use. All graphs of a device share
one ``CUDAGraphTree`` (one memory pool); outputs the user still holds are relocated before a replay
would overwrite them, so a decode loop needs no ``.clone()``. ``EmulatedGraphEngine`` runs the same
bookkeeping on CPU for tests.
"""

from .api import cudagraphify, wrap_reduce_overhead
from .engine import (
    CaptureFailed,
    CudaGraphEngine,
    EmulatedGraphEngine,
    GraphEngine,
    WarmupReport,
    WarmupWatcher,
)
from .function import CUDAGraphFunction, FunctionStats, default_tree, reset_default_trees
from .liveness import LivenessStats, PoolStorage
from .node import GraphNode
from .options import CUDAGraphOptions
from .tree import CUDAGraphTree, TreeStats

__all__ = [
    "CUDAGraphFunction", "CUDAGraphOptions", "CUDAGraphTree", "CaptureFailed", "CudaGraphEngine",
    "EmulatedGraphEngine", "FunctionStats", "GraphEngine", "GraphNode", "LivenessStats", "PoolStorage",
    "TreeStats", "WarmupReport", "WarmupWatcher", "cudagraphify", "default_tree", "reset_default_trees",
    "wrap_reduce_overhead",
]
