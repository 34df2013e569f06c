"""Output liveness: which pool storages the user still references, and moving them out of a replay's way.

A recorded graph writes its outputs to fixed pool addresses. Each replay hands the user fresh tensor
objects aliasing that memory. Before a replay that may overwrite it, ``PoolStorage.release`` checks the
storage's reference count (``torch._C._storage_Use_Count``: one per tensor or view on it) against the
count kiln itself holds. If the user still holds something, the tensors kiln handed out (tracked by
weakref) are re-pointed (``t.data = copy``) to a private copy of the bytes: one device copy, and the
user's tensor keeps its value, identity and autograd history. References kiln cannot re-point (views
the user made, tensors autograd saved) make ``release`` fail; the caller then runs that call without
the graph and hands out copies of this storage's outputs from then on.

Note: torch's CUDA graph trees instead poison such outputs ("accessing tensor output of CUDAGraphs that
has been overwritten") and ask the user to ``.clone()``; a decode loop that feeds its output back in and
keeps it (a list of tokens, the previous logits) just works here, at the price of one small copy.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)


@dataclass(slots=True)
class LivenessStats:
    relocations: int = 0  # handed-out tensors re-pointed to a private copy
    relocated_bytes: int = 0
    blocked: int = 0  # releases that failed (references kiln could not re-point)
    copied_outputs: int = 0  # outputs handed out as copies (storages in copy-out mode)


class PoolStorage:
    """One storage of a recorded graph's outputs, and the tensors handed out on it since its last release."""

    __slots__ = ("_bytes", "_cdata", "_handed", "baseline", "copy_out", "data_ptr", "nbytes", "owner",
                 "stats", "storage")

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

    def seal(self) -> None:
        """Take the current count as kiln's own (call when nothing has been handed out yet)."""
        self.baseline = self.use_count()

    def add_internal_ref(self) -> None:
        """A view kiln keeps on this storage (a consumer graph's input slot borrowing it)."""
        self.baseline += 1

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

    def release(self, relocate: bool = True) -> bool:
        """Ensure no user reference aliases this storage; False when one could not be moved."""
        if self.use_count() <= self.baseline:
            self._handed.clear()
            return True
        alive = [t for r in self._handed if (t := r()) is not None]
        self._handed.clear()
        if alive and relocate:
            copy = self._bytes.clone()
            with torch.no_grad():
                for t in alive:
                    t.data = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                        copy.untyped_storage(), t.storage_offset(), t.size(), t.stride())
            self.stats.relocations += len(alive)
            self.stats.relocated_bytes += self.nbytes
            del alive, copy
        if self.use_count() <= self.baseline:
            return True
        self.stats.blocked += 1
        return False
