"""A CUDA graph tree: every graph recorded on one device, in the order they ran, sharing one memory pool.

Recording order is what makes pool sharing safe. A graph's outputs stay allocated (the tree holds them),
so a graph recorded later never takes an earlier graph's outputs; it does take the memory of earlier
graphs' temporaries, which is how a backward reuses what the forward freed and the second half of a
graph break reuses the first half's scratch. The flip side: replaying graph N may overwrite the
outputs of N itself and of every graph recorded after N. So before replaying N, the tree releases
(``PoolStorage.release``) the outputs of nodes ``N..last`` that the user still holds — relocating them, or,
when it cannot, running that one call without the graph.

The tree records which graph ran before each recording (``parent``), so ``as_text()`` shows the paths
through a model: forward then backward, the pieces around a graph break, prefill then decode.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.graph import log

from .engine import CudaGraphEngine, GraphEngine
from .liveness import LivenessStats, PoolStorage
from .node import GraphNode
from .options import CUDAGraphOptions


@dataclass(slots=True)
class TreeStats:
    recordings: int = 0
    replays: int = 0
    eager_fallbacks: int = 0  # replays given up because outputs could not be released


class CUDAGraphTree:
    """The graphs of one device, their shared pool, and the liveness of what they handed out."""

    def __init__(self, device: torch.device | str | int | None = None, *,
                 engine: GraphEngine | None = None, name: str = "tree") -> None:
        self.engine: GraphEngine = engine if engine is not None else CudaGraphEngine()
        self.device = _as_device(device, self.engine.device_type)
        self.name = name
        self.nodes: list[GraphNode] = []
        self.last_run: GraphNode | None = None
        self.stats = TreeStats()
        self.liveness = LivenessStats()
        self._pool: object | None = None
        self._owners: dict[int, PoolStorage] = {}  # output storage data_ptr -> its PoolStorage
        self.generation = 0  # bumped by reset(); functions holding old nodes drop them

    @property
    def pool(self) -> object:
        if self._pool is None:
            self._pool = self.engine.new_pool(self.device)
        return self._pool

    def owner_of(self, t: torch.Tensor) -> PoolStorage | None:
        return self._owners.get(t.untyped_storage().data_ptr())

    def record(self, fn: Callable[..., Any], args: Sequence[Any], *, name: str,
               static_indices: Sequence[int], options: CUDAGraphOptions) -> GraphNode:
        """Record ``fn`` into a new graph of this tree (raises CaptureFailed). Does not run it."""
        order = len(self.nodes)
        node = GraphNode.plan_inputs(f"{name}#{order}", order, self.last_run, args, static_indices,
                                     self.owner_of)
        graph_args = node.graph_args(args)
        with torch.no_grad():
            for s in node.slots:
                if s.tensor.data_ptr() != args[s.index].data_ptr():
                    s.tensor.copy_(args[s.index])
        node.graph, outputs = self.engine.capture(fn, graph_args, pool=self.pool, device=self.device,
                                                  capture_error_mode=options.capture_error_mode)
        node.plan_outputs(outputs, graph_args, self.liveness)
        del outputs
        gc.collect(0)  # drop young cycles that may still view the outputs before counting kiln's refs
        for ps in node.storages:
            ps.seal()
            self._owners[ps.data_ptr] = ps
        self.nodes.append(node)
        if node.parent is not None:
            node.parent.children.append(node)
        self.stats.recordings += 1
        log("cudagraphs").info("recorded %s (%s) after %s", node.name, node.describe(),
                               node.parent.name if node.parent is not None else "nothing")
        return node

    def run(self, node: GraphNode, args: Sequence[Any], options: CUDAGraphOptions) -> tuple[bool, Any]:
        """Replay ``node`` on ``args``: (True, outputs), or (False, None) when the caller must run eagerly."""
        if not self._release_from(node, options.relocate_outputs):
            return False, None
        with torch.no_grad():
            if not node.load_inputs(args, options.relocate_outputs):
                self.stats.eager_fallbacks += 1
                log("cudagraphs").info("%s: an input slot shares memory with an output still in use; "
                                       "this call runs without the graph", node.name)
                return False, None
        self.engine.replay(node.graph)
        node.stats.replays += 1
        self.stats.replays += 1
        self.last_run = node
        return True, node.hand_out(args)

    def _release_from(self, node: GraphNode, relocate: bool) -> bool:
        blocked: list[PoolStorage] = []
        for later in self.nodes[node.order:]:
            for ps in later.storages:
                if not ps.release(relocate):
                    blocked.append(ps)
        if not blocked:
            return True
        for ps in blocked:
            ps.copy_out = True
        self.stats.eager_fallbacks += 1
        log("cudagraphs").info(
            "%s: %d output(s) of %s from an earlier replay are still referenced through views or saved "
            "tensors kiln cannot move; this call runs without the graph, and those outputs are handed "
            "out as copies from now on", node.name, len(blocked), ", ".join(sorted({b.owner for b in blocked})))
        return False

    def as_text(self) -> str:
        lines = [f"CUDAGraphTree {self.name} on {self.device}: {len(self.nodes)} graph(s), "
                 f"{self.stats.replays} replays, {self.stats.eager_fallbacks} eager fallbacks, "
                 f"{self.liveness.relocations} relocated outputs"]

        def walk(n: GraphNode, depth: int) -> None:
            lines.append("  " * (depth + 1) + n.describe())
            for c in n.children:
                walk(c, depth + 1)

        for n in self.nodes:
            if n.parent is None:
                walk(n, 0)
        return "\n".join(lines)

    def pool_bytes(self) -> int:
        """Bytes of graph outputs the tree holds in its pool (temporaries are shared and not counted)."""
        return sum(ps.nbytes for n in self.nodes for ps in n.storages)

    def reset(self) -> None:
        """Drop every graph (and with them the pool's memory, once the user drops their outputs)."""
        self.nodes.clear()
        self._owners.clear()
        self.last_run = None
        self._pool = None
        self.generation += 1


def _as_device(device: torch.device | str | int | None, device_type: str) -> torch.device:
    if device is None:
        if device_type == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(device_type)
    if isinstance(device, int):
        return torch.device(device_type, device)
    return torch.device(device)
