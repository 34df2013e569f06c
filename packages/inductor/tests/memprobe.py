"""Peak live tensor bytes on CPU, counted as a CUDA caching allocator would (a test helper; the
benchmark's richer version is benchmarks/memory_probe.py): every storage an op creates under the mode
counts until its Python object dies."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self, known: list[torch.Tensor]) -> None:
        super().__init__()
        self.known = {id(t.untyped_storage()) for t in known}
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                if id(s) in self.known or id(s) in self.live:
                    continue
                self.live[id(s)] = s.nbytes()
                self.current += s.nbytes()
                weakref.finalize(s, self._free, id(s))
                self.peak = max(self.peak, self.current)
        return out


def peak_bytes(fn: Callable[..., Any], *args: torch.Tensor) -> int:
    """Most bytes of tensors created by ``fn(*args)`` alive at once (its result included)."""
    mode = LiveBytes(list(args))
    with mode:
        out = fn(*args)
    del out
    return mode.peak
