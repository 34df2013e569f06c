"""Global-mode helpers every stage needs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


def autocast_off() -> contextlib.AbstractContextManager[None]:
    """Turn the caller's autocast off (CPU and CUDA) for the block. ATen graphs already hold
    autocast's casts as nodes: tracing, decomposing or running them under autocast would cast again
    and give values other dtypes than the graph says."""
    return _AutocastOff()


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


class _AutocastOff:
    """``autocast_off()``'s block. Note: every compiled call enters one; with autocast off (the usual
    case) it costs one C call, where a generator context manager over an ExitStack cost ~3 us."""

    __slots__ = ("stack",)

    def __enter__(self) -> None:
        self.stack: contextlib.ExitStack | None = None
        if _any_autocast is not None and not _any_autocast():
            return
        stack = contextlib.ExitStack()
        for dev in ("cpu", "cuda"):
            if torch.is_autocast_enabled(dev):
                stack.enter_context(torch.autocast(dev, enabled=False))
        self.stack = stack

    def __exit__(self, *exc: object) -> bool | None:
        return self.stack.__exit__(*exc) if self.stack is not None else None  # type: ignore[arg-type]


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
