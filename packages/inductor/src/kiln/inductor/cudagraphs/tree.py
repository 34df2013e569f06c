"""A CUDA graph tree: every graph recorded on one device, in the order they ran, sharing one memory pool.

Recording order is what makes pool sharing safe. A graph's outputs stay allocated (the tree holds them),
so a graph recorded later never takes an earlier graph's outputs; it does take the memory of earlier
graphs' temporaries, which is how a backward reuses what the forward freed and the second half of a
graph break reuses the first half's scratch. The flip side: replaying graph N may overwrite the
outputs of N itself and of every graph recorded after N. So before replaying N, the tree releases
(``PoolStorage.release``) the outputs of nodes ``N..last`` that the user still holds — relocating them, or,
when it cannot, running that one call without the graph.

Donation: a graph recorded with the caller's references handed over (``record(..., owned=True)``, a
backward called through ``call_owned``) may take over the saved activations it reads from earlier graphs
(``PoolStorage.donate``), so its scratch and gradients reuse their memory after their last read, as eager's
backward does; the pool then holds about what one eager step peaks at instead of the forward's outputs
plus the whole backward beside them. A donated storage is released before any graph recorded at or after
the donation replays (``_release_from``).

The tree records which graph ran before each recording (``parent``), so ``as_text()`` shows the paths
through a model: forward then backward, the pieces around a graph break, prefill then decode.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.graph import log

from .engine import CudaGraphEngine, GraphEngine
from .liveness import LivenessStats, PoolStorage, tensors_by_storage
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
        # what the recordings grew the allocator's reserved memory by, and the device's memory (engine.memory)
        self.kept_bytes = 0
        self.device_bytes: int | None = None
        self.liveness = LivenessStats()
        self._pool: object | None = None
        # output storage (its StorageImpl, not its address: donated memory can hold a later graph's
        # output at the same address) -> its PoolStorage
        self._owners: dict[int, PoolStorage] = {}
        self._donated: list[PoolStorage] = []  # storages a later recording may have reused (donate)
        # storages some graph reads in place (parameters, buffers): StorageImpl -> a weak reference, which
        # also keeps the StorageImpl's address from being reused while it is in this table
        self._static: dict[int, StorageWeakRef] = {}
        self.generation = 0  # bumped by reset(); functions holding old nodes drop them
        # a function was called with its inputs handed over (a backward): the tree runs training steps
        self.trains = False

    @property
    def pool(self) -> object:
        if self._pool is None:
            self._pool = self.engine.new_pool(self.device)
        return self._pool

    def owner_of(self, t: torch.Tensor) -> PoolStorage | None:
        return self._owners.get(t.untyped_storage()._cdata)

    def note_static(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        """Remember the storages of ``args[indices]``: graphs of this tree read them in place."""
        for i in indices:
            a = args[i]
            if isinstance(a, torch.Tensor) and a.numel() > 0:
                st = a.untyped_storage()
                self._static.setdefault(st._cdata, StorageWeakRef(st))

    def static_in(self, args: Sequence[Any]) -> set[int]:
        """Indices of ``args`` on a storage another graph of this tree reads in place: a parameter that a
        forward saved for its backward arrives there as an ordinary input, and is static there too (no
        slot, no copy per replay -- for a model's weights, their whole size)."""
        out: set[int] = set()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.numel() > 0:
                st = a.untyped_storage()
                ref = self._static.get(st._cdata)
                if ref is not None and not ref.expired():
                    out.add(i)
        return out

    def record(self, fn: Callable[..., Any], args: Sequence[Any], *, name: str,
               static_indices: Sequence[int], options: CUDAGraphOptions, owned: bool = False,
               checked: Sequence[int] = ()) -> GraphNode:
        """Record ``fn`` into a new graph of this tree (raises CaptureFailed). Does not run it.

        ``owned``: ``args`` is the caller's list, handed over (``fn.call_owned`` drops each input after
        its last read); earlier graphs' outputs it borrows that nothing else holds are donated to this
        recording, and their places in ``args`` are taken by kiln's (non-owning) views at the same address.
        ``checked``: static inputs whose shape, stride and dtype a replay checks besides their address."""
        order = len(self.nodes)
        node = GraphNode.plan_inputs(f"{name}#{order}", order, self.last_run, args, static_indices,
                                     self.owner_of, checked)
        graph_args = node.graph_args(args)
        with torch.no_grad():
            for s in node.slots:
                if s.tensor.data_ptr() != args[s.index].data_ptr():
                    s.tensor.copy_(args[s.index])
        watched: list[tuple[PoolStorage, StorageWeakRef]] = []
        before = self.engine.memory(self.device)
        if owned and options.donate_saved and getattr(self.engine, "donates", False) and isinstance(args, list):
            watched = self._donate_inputs(node, args, graph_args, order)
        node.graph, outputs = self.engine.capture(fn, graph_args, pool=self.pool, device=self.device,
                                                  capture_error_mode=options.capture_error_mode, owned=bool(watched),
                                                  expandable=bool(watched) or self.trains)
        if watched:
            graph_args = node.graph_args(args)  # the capture emptied the list it was handed
            self._log_donations(node, watched)
        node.plan_outputs(outputs, graph_args, self.liveness)
        del outputs
        gc.collect(0)  # drop young cycles that may still view the outputs before counting kiln's refs
        for ps in node.storages:
            ps.seal()
            self._owners[ps._cdata] = ps  # noqa: SLF001 - the storage's identity
        self.nodes.append(node)
        if node.parent is not None:
            node.parent.children.append(node)
        self.stats.recordings += 1
        after = self.engine.memory(self.device)
        grew = after[0] - before[0] if after is not None and before is not None else None
        if grew is not None and after is not None:
            self.kept_bytes += max(0, grew)
            self.device_bytes = after[1]
        log("cudagraphs").info("recorded %s (%s) after %s%s", node.name, node.describe(),
                               node.parent.name if node.parent is not None else "nothing",
                               "" if grew is None else f"; reserved memory grew {grew / 2**20:.1f} MiB, the "
                               f"tree's recordings keep {self.kept_bytes / 2**20:.1f} MiB")
        return node

    def budget_spent(self, fraction: float) -> tuple[float, float] | None:
        """(MiB kept, MiB allowed) once this tree's recordings keep ``fraction`` of the device's memory or
        more (CUDAGraphOptions.memory_fraction); None below it, or where the engine cannot tell."""
        if self.device_bytes is None or self.kept_bytes < fraction * self.device_bytes:
            return None
        return self.kept_bytes / 2**20, fraction * self.device_bytes / 2**20

    def _donate_inputs(self, node: GraphNode, args: list[Any], graph_args: list[Any],
                       order: int) -> list[tuple[PoolStorage, StorageWeakRef]]:
        """Hand the recording the caller's own tensors on borrowed storages nobody else holds (so the
        memory is freed after their last read inside the capture); kiln keeps non-owning views."""
        indices: dict[int, tuple[PoolStorage, list[int]]] = {}
        elsewhere: set[int] = set()  # a slot's argument lives elsewhere: that storage stays as it is
        for s in node.slots:
            ps = s.borrowed
            if ps is None or ps.donated_at is not None:
                continue
            if args[s.index].data_ptr() != s.tensor.data_ptr():
                elsewhere.add(id(ps))
            else:
                indices.setdefault(id(ps), (ps, []))[1].append(s.index)
        mine = tensors_by_storage(args)
        watched = []
        slot_at = {s.index: s for s in node.slots}
        for key, (ps, slots) in indices.items():
            if key in elsewhere or ps.outside_refs(mine.get(ps.data_ptr, ())) > 0:
                continue
            for i in slots:
                graph_args[i] = args[i]  # the only owners left, dropped by the capture after their last read
                args[i] = slot_at[i].tensor  # kiln's view (re-pointed below): same address, owns nothing
            before = ps._cdata  # noqa: SLF001
            watched.append((ps, StorageWeakRef(ps.donate(order))))
            self._owners.pop(before, None)
            self._owners[ps._cdata] = ps  # noqa: SLF001 - now the non-owning storage's identity
            self._donated.append(ps)
        return watched

    def _log_donations(self, node: GraphNode, watched: list[tuple[PoolStorage, StorageWeakRef]]) -> None:
        freed = [ps for ps, ref in watched if ref.expired()]
        held = len(watched) - len(freed)
        self.liveness.donated_held += held
        log("cudagraphs").info(
            "%s reuses %d saved output(s) of %s (%.1f MiB) after their last read%s", node.name, len(freed),
            ", ".join(sorted({ps.owner for ps, _ in watched})), sum(ps.nbytes for ps in freed) / 2**20,
            f"; {held} stayed allocated (held elsewhere during the recording)" if held else "")

    def run(self, node: GraphNode, args: Sequence[Any], options: CUDAGraphOptions,
            owned: bool = False) -> tuple[bool, Any]:
        """Replay ``node`` on ``args``: (True, outputs), or (False, None) when the caller must run eagerly.
        ``owned``: the caller handed its references over, so its tensors on donated memory are this
        call's to overwrite (otherwise they count as held, and are moved out first)."""
        if not self._release_from(node, options.relocate_outputs, args if owned else ()):
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

    def _release_from(self, node: GraphNode, relocate: bool, args: Sequence[Any] = ()) -> bool:
        blocked: list[PoolStorage] = []
        for later in self.nodes[node.order:]:
            for ps in later.storages:
                if not ps.release(relocate):
                    blocked.append(ps)
        mine: dict[int, list[torch.Tensor]] | None = None  # args by storage, built once if needed
        for ps in self._donated:  # memory any graph recorded since its donation may overwrite
            if ps.donated_at is not None and ps.donated_at <= node.order:
                if mine is None:
                    mine = tensors_by_storage(args)
                if not ps.release(relocate, mine.get(ps.data_ptr, ())):
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
        # tensors handed out on donated storages do not keep the pool alive: move them out first, or
        # keep the graphs (and so the pool) for as long as the process lives when they cannot move
        if any(not ps.release(True) for ps in self._donated):
            _KEPT.append(list(self.nodes))
            log("cudagraphs").info("%s reset while outputs on donated memory are still referenced through "
                                   "views kiln cannot move: its graphs and pool are kept", self.name)
        self._donated.clear()
        self._static.clear()
        self.nodes.clear()
        self._owners.clear()
        self.last_run = None
        self._pool = None
        self.generation += 1


_KEPT: list[list[GraphNode]] = []  # graphs of reset trees whose donated memory is still in use


def _as_device(device: torch.device | str | int | None, device_type: str) -> torch.device:
    if device is None:
        if device_type == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(device_type)
    if isinstance(device, int):
        return torch.device(device_type, device)
    return torch.device(device)
