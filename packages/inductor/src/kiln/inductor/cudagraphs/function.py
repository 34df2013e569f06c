"""cudagraphify: wrap any compiled callable so that its calls replay CUDA graphs of one tree.

Per input signature (shapes, strides, dtypes of the non-static tensors; addresses of the static ones;
values of non-tensors): the first call is a warm-up run (lazy initialisation, autotuning, and the checks
that decide whether graphs are safe), the second records a graph and replays it, later calls replay.
After ``max_recordings`` signatures, new ones run without graphs (logged once); a call finds its
recording by the shapes of its non-static inputs. An input the first warm-up sees written in place
becomes static (graphed at its own address, its layout checked per call: a replay writes the caller's
tensor). A function is not graphed at all, with its reason logged, when it takes or returns CPU
tensors, synchronises with the host, or its capture fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.graph import log

from .engine import CaptureFailed
from .node import GraphNode
from .options import CUDAGraphOptions
from .tree import CUDAGraphTree


@dataclass(slots=True)
class FunctionStats:
    warmups: int = 0
    recordings: int = 0
    replays: int = 0
    eager_calls: int = 0  # calls run without a graph (skipped, over the limit, or outputs in use)


class CUDAGraphFunction:
    """A callable that replays CUDA graphs of ``fn`` (one per input signature) inside a tree."""

    def __init__(self, fn: Callable[..., Any], *, static_input_indices: Sequence[int] = (),
                 tree: CUDAGraphTree, options: CUDAGraphOptions | None = None,
                 name: str | None = None, written_inputs: Sequence[int] = ()) -> None:
        self.fn = fn
        self.name: str = str(name or getattr(fn, "__name__", type(fn).__name__))
        self.static_input_indices = frozenset(static_input_indices)
        self.tree = tree
        self.options = options or CUDAGraphOptions()
        # static because written in place (_graph_in_place): those the compiler says it writes
        # (``written_inputs``), and any other a warm-up sees written
        self.written_in_place: frozenset[int] = frozenset()
        if written_inputs and self.options.graph_written_inputs:
            self.written_in_place = frozenset(written_inputs)
            self.static_input_indices = self.static_input_indices | self.written_in_place
        self.nodes: list[GraphNode] = []
        # the nodes by the shapes of the non-static tensor inputs: a call whose sizes changed (a decode
        # step, a new batch) finds its recording without asking every node (each compares the static
        # inputs' addresses first: hundreds of parameters)
        self._by_shapes: dict[tuple[Any, ...], list[GraphNode]] = {}
        self._dynamic: tuple[frozenset[int], int, list[int]] | None = None  # see _shapes
        self.stats = FunctionStats()
        self.skip_reason: str | None = None
        self._last: GraphNode | None = None
        self._warm: dict[tuple[Any, ...], int] = {}
        self._limit_logged = False
        self._generation = tree.generation
        self._statics_noted = False

    def _forget(self) -> None:
        self.nodes.clear()
        self._by_shapes.clear()
        self._warm.clear()
        self._last = None
        self._limit_logged = False
        self._generation = self.tree.generation
        self._statics_noted = False

    def __call__(self, *args: Any) -> Any:
        return self._call(args, owned=False)

    def call_owned(self, args: list[Any]) -> Any:
        """Call with the caller's references handed over (the list is emptied), as ``fn.call_owned``:
        a backward's recording may then reuse the saved activations it reads (``CUDAGraphTree.record``)."""
        self.tree.trains = True
        try:
            return self._call(args, owned=True)
        finally:
            args.clear()

    def _call(self, args: Sequence[Any], owned: bool) -> Any:
        if self.skip_reason is not None:
            return self._eager(args, owned)
        if self._generation != self.tree.generation:  # the tree was reset: start over
            self._forget()
        node = self._last
        if node is None or not node.accepts(args):
            node = next((n for n in self._by_shapes.get(self._shapes(args), ()) if n.accepts(args)), None)
        if node is None:
            return self._miss(args, owned)
        ok, out = self.tree.run(node, args, self.options, owned=owned)
        if not ok:
            self.stats.eager_calls += 1
            return self._eager(args, owned)
        self._last = node
        self.stats.replays += 1
        return out

    def _eager(self, args: Sequence[Any], owned: bool) -> Any:
        call_owned = getattr(self.fn, "call_owned", None) if owned else None
        return call_owned(args) if call_owned is not None else self.fn(*args)

    def skip(self, reason: str) -> None:
        """Run without CUDA graphs from now on, saying why once."""
        if self.skip_reason is None:
            self.skip_reason = reason
            log("cudagraphs").info("skipping CUDA graphs for %s: %s", self.name, reason)

    def _miss(self, args: Sequence[Any], owned: bool) -> Any:
        reason = _unsupported_args(args, self.tree.device)
        if reason is not None:
            self.skip(reason)
            return self._eager(args, owned)
        if not self._statics_noted:
            self._note_statics(args)
        # before the warm-up count: recording stops here
        full = self.tree.budget_spent(self.options.memory_fraction)
        if len(self.nodes) >= self.options.max_recordings or full is not None:
            self.stats.eager_calls += 1
            if not self._limit_logged:
                self._limit_logged = True
                limit = (f"{len(self.nodes)} input signatures recorded (the limit, CUDAGraphOptions.max_recordings)"
                         if full is None else f"the tree's recordings keep {full[0]:.0f} MiB of the "
                         f"{full[1]:.0f} MiB they may (CUDAGraphOptions.memory_fraction)")
                log("cudagraphs").info("%s: %s; new shapes run without CUDA graphs (mark dimensions dynamic or "
                                       "pad inputs to fewer shapes)", self.name, limit)
            return self._eager(args, owned)
        key = self._signature(args)
        if self._warm.get(key, 0) < self.options.warmup_runs:
            return self._warm_up(key, args)
        hand_over = owned and isinstance(args, list) and hasattr(self.fn, "call_owned")
        try:
            node = self.tree.record(self.fn, args, name=self.name, static_indices=sorted(self.static_input_indices),
                                    options=self.options, owned=hand_over, checked=sorted(self.written_in_place))
        except CaptureFailed as e:
            self.skip(f"recording failed ({e}); the function cannot be captured into a CUDA graph")
            return self._eager(args, owned)
        except Exception as e:  # kiln's own bookkeeping must never turn a working call into an error
            self.skip(f"recording failed in kiln ({type(e).__name__}: {e}); please report this")
            return self._eager(args, owned)
        self.nodes.append(node)
        self._by_shapes.setdefault(self._shapes(args), []).append(node)
        self._warm.pop(key, None)  # recorded: its warm-up count is not asked again
        self.stats.recordings += 1
        log("cudagraphs").info("%s: CUDA graph %d (of at most %d) recorded for input sizes %s; the tree's "
                               "recordings keep %.1f MiB", self.name, len(self.nodes), self.options.max_recordings,
                               [tuple(a.shape) for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                                and i not in self.static_input_indices], self.tree.kept_bytes / 2**20)
        ok, out = self.tree.run(node, args, self.options, owned=hand_over)
        if not ok:  # cannot happen on a fresh recording, but stay correct if it does
            self.stats.eager_calls += 1
            return self._eager(args, owned)
        self._last = node
        self.stats.replays += 1
        return out

    def _note_statics(self, args: Sequence[Any]) -> None:
        """First call: share this function's static inputs with the tree, and take as static the inputs
        that other graphs of the tree read in place (a backward's saved parameters)."""
        self._statics_noted = True
        inferred = self.tree.static_in(args) - self.static_input_indices
        if inferred:
            self.static_input_indices = self.static_input_indices | inferred
            log("cudagraphs").info("%s: %d input(s) are parameters/buffers that other graphs read in place; "
                                   "static here too", self.name, len(inferred))
        self.tree.note_static(args, sorted(self.static_input_indices))

    def _warm_up(self, key: tuple[Any, ...], args: Sequence[Any]) -> Any:
        self._warm[key] = self._warm.get(key, 0) + 1
        self.stats.warmups += 1
        dynamic = [(i, a) for i, a in enumerate(args)
                   if isinstance(a, torch.Tensor) and i not in self.static_input_indices]
        versions = [(i, a._version) for i, a in dynamic if not a.is_inference()]  # inference: no counter
        watch = {a.untyped_storage().data_ptr(): i for i, a in dynamic if a.numel() > 0}
        with self.tree.engine.watch_warmup(watch, self.tree.device) as report:
            out = self.fn(*args)
        syncs = report.syncs if self.options.detect_syncs else []
        mutated = sorted(report.mutated | {i for i, v in versions if args[i]._version != v})
        if mutated and self.options.graph_written_inputs and not self.nodes:
            self._graph_in_place(args, mutated)
        elif mutated:
            self.skip(f"it mutates input(s) {mutated} that are not static (parameters/buffers); a replay "
                      "would update kiln's copy, not your tensor. Register the tensor as a buffer, or "
                      "return the new value instead of updating it in place")
        elif syncs:
            self.skip(f"it synchronises with the host ({syncs[0]}), which a CUDA graph cannot capture; "
                      "move .item()/.cpu()/data-dependent shapes out of the compiled region")
        else:
            self._check_outputs(out, args)
        return out

    def _graph_in_place(self, args: Sequence[Any], written: list[int]) -> None:
        """Inputs the function writes in place (a StaticCache's key/value tensors, updated at the step's
        position) are graphed at their own address, as parameters are: the replay writes the caller's
        tensor itself, not a copy. A call with such an input elsewhere, or of another layout there, is a
        new signature (recorded again up to the cap, else run without graphs)."""
        self.written_in_place = self.written_in_place | frozenset(written)
        self.static_input_indices = self.static_input_indices | frozenset(written)
        self.tree.note_static(args, written)
        log("cudagraphs").info("%s: input(s) %s are written in place: graphed at their own address (a call "
                               "with them at another address is recorded again)", self.name, written)

    def _check_outputs(self, out: Any, args: Sequence[Any]) -> None:
        seq = out if isinstance(out, (tuple, list)) else (out,)
        # An argument handed back (a parameter a forward graph saves for the backward) requires grad
        # but is no new autograd history: the replay returns the caller's tensor itself.
        arg_storages = {a.untyped_storage().data_ptr() for a in args
                        if isinstance(a, torch.Tensor) and a.numel() > 0}
        for o in seq:
            if isinstance(o, torch.Tensor):
                if o.device.type != self.tree.device.type:
                    self.skip(f"it returns a tensor on {o.device}; CUDA graphs need every output on "
                              f"{self.tree.device}")
                    return
                if o.requires_grad and (o.numel() == 0 or o.untyped_storage().data_ptr() not in arg_storages):
                    self.skip("it returns tensors that require grad; graph the forward and backward "
                              "graphs (which autograd wraps), not a differentiable callable")
                    return
            elif not isinstance(o, (int, float, bool, type(None))):
                self.skip(f"it returns a {type(o).__name__}; graphed functions return tensors and numbers")
                return

    def _shapes(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """The shapes of the non-static tensor inputs (the index of ``_by_shapes``); the positions to look
        at are found once per static set (a graph's inputs are hundreds of parameters and a few others)."""
        statics, d = self.static_input_indices, self._dynamic
        if d is None or d[0] is not statics or d[1] != len(args):  # the set is replaced, never changed in place
            d = self._dynamic = (statics, len(args), [i for i in range(len(args)) if i not in statics])
        return tuple(a.shape if isinstance(a, torch.Tensor) else None for a in map(args.__getitem__, d[2]))

    def _signature(self, args: Sequence[Any]) -> tuple[Any, ...]:
        sig: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if i in self.static_input_indices:
                    sig.append(("static", a.data_ptr()))
                else:
                    sig.append((tuple(a.shape), a.stride(), a.dtype))
            else:
                sig.append((type(a), a if _hashable(a) else id(a)))
        return tuple(sig)

    def as_text(self) -> str:
        head = f"{self.name}: {len(self.nodes)} graph(s), {self.stats}"
        if self.skip_reason:
            head += f"\n  skipped: {self.skip_reason}"
        return head


def _unsupported_args(args: Sequence[Any], device: torch.device) -> str | None:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.device.type != device.type or (
                    a.device.index is not None and device.index is not None and a.device.index != device.index):
                return (f"input {i} is a tensor on {a.device}; this tree's CUDA graphs need every tensor "
                        f"on {device} (move it there, or leave this function in default mode)")
            if a.is_sparse or a.layout != torch.strided:
                return f"input {i} has layout {a.layout}; only strided tensors are graphed"
        elif isinstance(a, (list, tuple, dict)):
            return f"input {i} is a {type(a).__name__}; graphed functions take flat tensors and numbers"
    return None


def _hashable(a: Any) -> bool:
    try:
        hash(a)
    except TypeError:
        return False
    return True


_DEFAULT_TREES: dict[torch.device, CUDAGraphTree] = {}
_TREES_LOCK = threading.Lock()


def default_tree(device: torch.device) -> CUDAGraphTree:
    """The tree (one pool) every reduce-overhead function on ``device`` shares.

    Per device, not per thread: autograd runs a CUDA backward on its own device thread, and the
    backward must join its forward's tree. A tree is not for concurrent use from several threads.
    """
    key = device
    with _TREES_LOCK:
        tree = _DEFAULT_TREES.get(key)
        if tree is None:
            tree = _DEFAULT_TREES[key] = CUDAGraphTree(device, name=f"{device}")
        return tree


def reset_default_trees() -> None:
    """Forget all default trees (kiln.reset()); functions wrapped earlier keep their own tree."""
    with _TREES_LOCK:
        for tree in _DEFAULT_TREES.values():
            tree.reset()  # moves tensors still on donated memory out before the pool can go
        _DEFAULT_TREES.clear()
