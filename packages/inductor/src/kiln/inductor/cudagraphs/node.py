"""One recorded graph of a tree: how its inputs reach the graph, and how its outputs reach the user.

Inputs, by kind:
- ``static``: parameters and buffers; the graph reads them in place, so a replay requires the same
  addresses (checked on every call; a moved parameter is a new recording).
- ``slot``: every other tensor; the graph reads a slot, and the argument is copied in before a replay.
  A slot either owns memory (allocated at recording) or *borrows* the output storage of the earlier
  graph that produced the argument (forward activations read by the backward, the first half of a graph
  break read by the second): then a call passing that producer's latest output needs no copy at all.
- ``value``: Python numbers and other non-tensors, which are part of the recording's key.

Outputs, by kind: ``pool`` (memory the graph owns, handed out through ``PoolStorage``), ``alias``
(a view of input slot *i*, rebuilt as the same view of the caller's argument), ``fixed`` (aliases a
static input or a tensor outside the pool, returned as is) and ``value``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .liveness import LivenessStats, PoolStorage

_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


@dataclass(slots=True)
class Slot:
    index: int  # argument position
    tensor: torch.Tensor  # what the graph reads
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    borrowed: PoolStorage | None  # the producer's output storage this slot lives in, if any


@dataclass(slots=True)
class OutputPlan:
    kind: str  # "pool" | "alias" | "fixed" | "value"
    value: Any  # the static output tensor (or the Python value)
    storage: PoolStorage | None = None  # for "pool"
    arg_index: int = -1  # for "alias"
    slot_offset: int = 0  # for "alias": the slot's storage offset


@dataclass(slots=True)
class NodeStats:
    replays: int = 0
    input_copies: int = 0
    zero_copy_inputs: int = 0


@dataclass(eq=False)
class GraphNode:
    name: str
    order: int  # position in the tree's recording order
    parent: GraphNode | None  # the graph that ran before this one was recorded
    nargs: int
    static_indices: tuple[int, ...]
    static_ptrs: list[int]
    slots: list[Slot]
    full_ptrs: list[int | None]  # static_ptrs by argument position (for the one-call address check)
    values: list[tuple[int, Any]]
    # static inputs whose layout is checked too (inputs the function writes in place, graphed at their own
    # address): (position, shape, stride, dtype); a parameter's layout never changes under its address
    layouts: list[tuple[int, torch.Size, tuple[int, ...], torch.dtype]] = field(default_factory=list)
    graph: object = None
    outputs: list[OutputPlan] = field(default_factory=list)
    container: type = tuple  # tuple, list, or torch.Tensor for a bare tensor result
    storages: list[PoolStorage] = field(default_factory=list)
    children: list[GraphNode] = field(default_factory=list)
    stats: NodeStats = field(default_factory=NodeStats)

    # --- building (at recording) ---------------------------------------------------------------

    @staticmethod
    def plan_inputs(name: str, order: int, parent: GraphNode | None, args: Sequence[Any],
                    static_indices: Sequence[int],
                    owner_of: Callable[[torch.Tensor], PoolStorage | None],
                    checked: Sequence[int] = ()) -> GraphNode:
        static = set(static_indices)
        static_idx: list[int] = []
        slots: list[Slot] = []
        values: list[tuple[int, Any]] = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                values.append((i, a))
            elif i in static:
                static_idx.append(i)
            else:
                slots.append(_make_slot(i, a, owner_of(a)))
        ptrs = [args[i].data_ptr() for i in static_idx]
        full: list[int | None] = [None] * len(args)
        for i, p in zip(static_idx, ptrs):
            full[i] = p
        layouts = [(i, args[i].shape, args[i].stride(), args[i].dtype) for i in checked if i in static]
        return GraphNode(name=name, order=order, parent=parent, nargs=len(args),
                         static_indices=tuple(static_idx), static_ptrs=ptrs, slots=slots,
                         full_ptrs=full, values=values, layouts=layouts)

    def graph_args(self, args: Sequence[Any]) -> list[Any]:
        out = list(args)
        for s in self.slots:
            out[s.index] = s.tensor
        return out

    def plan_outputs(self, outputs: Any, args: Sequence[Any], stats: LivenessStats) -> None:
        if isinstance(outputs, torch.Tensor):
            self.container, seq = torch.Tensor, [outputs]
        elif isinstance(outputs, (tuple, list)):
            self.container, seq = type(outputs), list(outputs)
        else:
            raise TypeError(f"a CUDA-graphed function must return tensors or a tuple/list, got {type(outputs)}")
        # by storage identity: an output at the address of a donated input is new memory, not a view of it
        slot_by_storage: dict[int, list[Slot]] = {}
        for s in self.slots:
            slot_by_storage.setdefault(s.tensor.untyped_storage()._cdata, []).append(s)
        static_ptrs = {args[i].untyped_storage().data_ptr() for i in self.static_indices}
        storages: dict[int, PoolStorage] = {}
        for o in seq:
            if not isinstance(o, torch.Tensor):
                self.outputs.append(OutputPlan("value", o))
                continue
            ptr = o.untyped_storage().data_ptr()
            aliased = slot_by_storage.get(o.untyped_storage()._cdata)
            if aliased:
                s = _containing_slot(aliased, o)
                self.outputs.append(OutputPlan("alias", o, arg_index=s.index,
                                               slot_offset=int(s.tensor.storage_offset())))
            elif ptr in static_ptrs or o.numel() == 0:
                self.outputs.append(OutputPlan("fixed", o))
            else:
                if ptr not in storages:
                    storages[ptr] = PoolStorage(o, self.name, stats)
                # kept detached: a view's ``_base`` would pin the storage that ``donate`` re-points it off
                static = o.detach()
                storages[ptr].keep(static)
                self.outputs.append(OutputPlan("pool", static, storage=storages[ptr]))
        self.storages = list(storages.values())

    # --- calling --------------------------------------------------------------------------------

    def accepts(self, args: Sequence[Any]) -> bool:
        if len(args) != self.nargs:
            return False
        if self.static_indices and not self._static_match(args):
            return False
        for i, shape, stride, dtype in self.layouts:
            a = args[i]
            if a.shape != shape or a.stride() != stride or a.dtype != dtype:
                return False
        for s in self.slots:
            a = args[s.index]
            if (not isinstance(a, torch.Tensor) or a.dtype != s.dtype or a.shape != s.shape
                    or a.stride() != s.stride):
                return False
        for i, v in self.values:
            a = args[i]
            if type(a) is not type(v) or a != v:
                return False
        return True

    def _static_match(self, args: Sequence[Any]) -> bool:
        for i in self.static_indices:
            if not isinstance(args[i], torch.Tensor):
                return False
        if _ptrs_equal is not None:
            return bool(_ptrs_equal(list(args), self.full_ptrs, list(self.static_indices)))
        return all(args[i].data_ptr() == p for i, p in zip(self.static_indices, self.static_ptrs))

    def load_inputs(self, args: Sequence[Any], relocate: bool) -> bool:
        """Copy arguments into slots; False when a borrowed slot's producer output is still in use."""
        for s in self.slots:
            a = args[s.index]
            if a.data_ptr() == s.tensor.data_ptr():
                self.stats.zero_copy_inputs += 1
                continue
            if s.borrowed is not None and not s.borrowed.release(relocate):
                return False
            s.tensor.copy_(a)
            self.stats.input_copies += 1
        return True

    def hand_out(self, args: Sequence[Any]) -> Any:
        result: list[Any] = []
        for p in self.outputs:
            if p.kind == "pool":
                assert p.storage is not None
                result.append(p.storage.hand_out(p.value))
            elif p.kind == "alias":
                a = args[p.arg_index]
                o = p.value
                result.append(a.as_strided(o.size(), o.stride(),
                                           a.storage_offset() + o.storage_offset() - p.slot_offset))
            else:
                result.append(p.value)
        if self.container is torch.Tensor:
            return result[0]
        return self.container(result)

    def describe(self) -> str:
        kinds = []
        slot_at = {s.index: s for s in self.slots}
        for i in range(self.nargs):
            if i in slot_at:
                s = slot_at[i]
                kinds.append(f"borrow<{s.borrowed.owner}>" if s.borrowed is not None else "copy")
            elif i in self.static_indices:
                kinds.append("static")
            else:
                kinds.append("value")
        outs = ",".join(p.kind for p in self.outputs)
        return f"{self.name} inputs[{' '.join(kinds)}] outputs[{outs}] replays={self.stats.replays}"


def _make_slot(index: int, arg: torch.Tensor, producer: PoolStorage | None) -> Slot:
    if producer is not None:
        view = torch.empty(0, dtype=arg.dtype, device=arg.device).set_(
            producer.storage, arg.storage_offset(), arg.size(), arg.stride())
        producer.add_internal_ref(view)
    else:
        view = torch.empty_strided(arg.size(), arg.stride(), dtype=arg.dtype, device=arg.device)
    return Slot(index, view, arg.shape, arg.stride(), arg.dtype, producer)


def _containing_slot(candidates: list[Slot], out: torch.Tensor) -> Slot:
    """The slot whose memory holds ``out`` (several slots share a storage only when borrowed)."""
    for s in candidates:
        t = s.tensor
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
        if t.storage_offset() <= out.storage_offset() < t.storage_offset() + extent:
            return s
    return candidates[0]
