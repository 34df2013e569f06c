"""Output liveness: which pool storages the user still references, and moving them out of a replay's way.

A recorded graph writes its outputs to fixed pool addresses. Each replay hands the user fresh tensor
objects aliasing that memory. Before a replay that may overwrite it, ``PoolStorage.release`` checks the
storage's reference count (``torch._C._storage_Use_Count``: one per tensor or view on it) against the
count kiln itself holds. If the user still holds something, the tensors kiln handed out (tracked by
weakref) are re-pointed (``t.data = copy``) to a private copy of the bytes: one device copy, and the
user's tensor keeps its value, identity and autograd history. References kiln cannot re-point (views
the user made, tensors autograd saved) make ``release`` fail; the caller then runs that call without
the graph and hands out copies of this storage's outputs from then on.

Donation (``PoolStorage.donate``): a backward graph reads the forward's saved activations in place and,
as eager's autograd engine does, drops each after its last use. For that memory to serve the backward's
own scratch and gradients while it is recorded, kiln's references to the storage must not keep it
allocated: ``donate`` re-points every tensor kiln keeps on it to a *non-owning* storage at the same
address, so the caller's tensors (handed over to the recording) are the last owners. From then on the
allocator may give that memory to any graph recorded later, so a replay of any node recorded at or after
the donation first releases the donated storage (``donated_at``), not counting the tensors the call itself
passes in (the backward's own saved activations).

Note: torch's CUDA graph trees instead poison such outputs ("accessing tensor output of CUDAGraphs that
has been overwritten") and ask the user to ``.clone()``; a decode loop that feeds its output back in and
keeps it (a list of tokens, the previous logits) just works here, at the price of one small copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)
# a storage over memory it does not own (torch's own CUDA graph trees hand outputs out this way)
_non_owning = getattr(torch._C, "_construct_storage_from_data_pointer", None)
CAN_DONATE = _use_count is not None and _non_owning is not None


@dataclass(slots=True)
class LivenessStats:
    relocations: int = 0  # handed-out tensors re-pointed to a private copy
    relocated_bytes: int = 0
    blocked: int = 0  # releases that failed (references kiln could not re-point)
    copied_outputs: int = 0  # outputs handed out as copies (storages in copy-out mode)
    donated: int = 0  # output storages whose memory a later recording was allowed to reuse
    donated_bytes: int = 0
    donated_held: int = 0  # donated storages the recording could not free (referenced elsewhere)


def tensors_by_storage(args: Sequence[Any]) -> dict[int, list[torch.Tensor]]:
    """The distinct tensors of ``args`` by their storage's address: a call's own references."""
    out: dict[int, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for a in args:
        if isinstance(a, torch.Tensor) and id(a) not in seen:
            seen.add(id(a))
            out.setdefault(a.untyped_storage().data_ptr(), []).append(a)
    return out


class PoolStorage:
    """One storage of a recorded graph's outputs, and the tensors handed out on it since its last release."""

    __slots__ = ("_bytes", "_cdata", "_handed", "baseline", "copy_out", "data_ptr", "donated_at", "internal",
                 "nbytes", "owner", "stats", "storage")

    def __init__(self, tensor: torch.Tensor, owner: str, stats: LivenessStats) -> None:
        self.storage = tensor.untyped_storage()  # held, so the count below stays stable
        self._cdata: int = self.storage._cdata
        self.data_ptr = self.storage.data_ptr()
        self.nbytes = self.storage.nbytes()
        self._bytes = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(self.storage)
        self._handed: list[weakref.ref[torch.Tensor]] = []
        self.baseline = 0
        self.copy_out = False
        self.owner = owner
        self.stats = stats
        self.internal: list[torch.Tensor] = []  # tensors kiln keeps on this storage (static outputs, slots)
        self.donated_at: int | None = None  # recording order from which later graphs may reuse the memory

    def seal(self) -> None:
        """Take the current count as kiln's own (call when nothing has been handed out yet)."""
        self.baseline = self.use_count()

    def add_internal_ref(self, view: torch.Tensor | None = None) -> None:
        """A view kiln keeps on this storage (a consumer graph's input slot borrowing it)."""
        self.baseline += 1
        if view is not None:
            self.internal.append(view)

    def keep(self, tensor: torch.Tensor) -> None:
        """A tensor kiln holds on this storage for good (a recorded graph's static output)."""
        self.internal.append(tensor)

    def outside_refs(self, own: Sequence[torch.Tensor] = ()) -> int:
        """References beyond kiln's own, not counting ``own``: a call's own distinct tensors on this
        storage (``tensors_by_storage``)."""
        return self.use_count() - self.baseline - len(own)

    def donate(self, order: int) -> torch.UntypedStorage:
        """Let the recording at ``order`` (and later ones) reuse this memory once its last owner drops it:
        kiln's tensors move to a non-owning storage at the same address. Returns the owning storage,
        which the caller must drop (it only watches it with a weak reference)."""
        assert _non_owning is not None
        owning = self.storage
        loose = _non_owning(self.data_ptr, owning.device, self.nbytes)
        with torch.no_grad():
            for t in [self._bytes, *self.internal]:  # ``.data``: also detached tensors and views
                t.data = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                    loose, t.storage_offset(), t.size(), t.stride())
        self.storage, self._cdata = loose, loose._cdata
        self.baseline = self.use_count()
        self.donated_at = order
        self.stats.donated += 1
        self.stats.donated_bytes += self.nbytes
        return owning

    def use_count(self) -> int:
        if _use_count is not None:
            return int(_use_count(self._cdata))
        # Without the storage count only the tensors kiln handed out are seen (views are not).
        return self.baseline + sum(1 for r in self._handed if r() is not None)

    def is_referenced(self) -> bool:
        return self.use_count() > self.baseline

    def hand_out(self, static: torch.Tensor) -> torch.Tensor:
        if self.copy_out:
            self.stats.copied_outputs += 1
            return static.clone()
        out = static.detach()
        self._handed.append(weakref.ref(out))
        return out

    def release(self, relocate: bool = True, own: Sequence[torch.Tensor] = ()) -> bool:
        """Ensure no user reference aliases this storage; False when one could not be moved. ``own``:
        the tensors on it of the call about to run, which reads them before overwriting (a donated
        storage's consumer) -- neither counted nor moved."""
        if self.outside_refs(own) <= 0:
            self._handed.clear()
            return True
        keep = {id(t) for t in own}
        alive = [t for r in self._handed if (t := r()) is not None and id(t) not in keep]
        self._handed = [weakref.ref(t) for t in own]
        if alive and relocate:
            # only the bytes the handed-out tensors reach (a storage may be a whole arena of which
            # the outputs are a part: kiln.inductor's scheduler/arena.py)
            lo, hi = _extent(alive, self.nbytes)
            copy = self._bytes[lo:hi].clone()
            with torch.no_grad():
                for t in alive:
                    t.data = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                        copy.untyped_storage(), t.storage_offset() - lo // t.element_size(), t.size(), t.stride())
            self.stats.relocations += len(alive)
            self.stats.relocated_bytes += hi - lo
            del alive, copy
        if self.outside_refs(own) <= 0:
            return True
        self.stats.blocked += 1
        return False


def _extent(tensors: Sequence[torch.Tensor], nbytes: int) -> tuple[int, int]:
    """The byte range of a storage that ``tensors`` reach, its start aligned down to 16 bytes (a
    multiple of every element size), so each keeps a whole-element offset in a copy of that range."""
    lo, hi = nbytes, 0
    for t in tensors:
        item = t.element_size()
        first = int(t.storage_offset()) * item
        reach = 1 + sum((n - 1) * st for n, st in zip(t.size(), t.stride())) if t.numel() else 0
        lo, hi = min(lo, first), max(hi, first + reach * item)
    lo = lo // 16 * 16
    return (lo, hi) if hi > lo else (0, nbytes)
