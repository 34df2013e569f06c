"""Global-mode helpers every stage needs."""

from __future__ import annotations

import contextlib
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
