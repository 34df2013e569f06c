"""Global-mode helpers every stage needs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Turn the caller's autocast off (CPU and CUDA) for the block. ATen graphs already hold
    autocast's casts as nodes: tracing, decomposing or running them under autocast would cast again
    and give values other dtypes than the graph says."""
    with contextlib.ExitStack() as stack:
        for dev in ("cpu", "cuda"):
            if torch.is_autocast_enabled(dev):
                stack.enter_context(torch.autocast(dev, enabled=False))
        yield


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic GC off for the block. Compiling a frame (capture) or loading an artifact
    (runtime) allocates tens to hundreds of thousands of objects that stay alive until it ends (fake
    tensors, fx nodes, IR; the parsed manifest and guard plan), so collections during it rescan them for
    nothing (about a fifth of BERT's compile time; ~1 ms of a mobilenet load). Garbage left is collected
    afterwards; a program that turned GC off (or an enclosing block) keeps it off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
