"""Python's cyclic GC is paused while a frame compiles (capture + backend) and restored after, also
when compilation fails; a program that turned GC off keeps it off."""

from __future__ import annotations

import gc

import pytest
import torch

from kiln.capture import optimize


def _recording_backend(seen: list[bool]):
    def backend(gm, example_inputs):
        seen.append(gc.isenabled())
        return gm.forward
    return backend


def test_gc_is_off_while_compiling_and_back_on_after() -> None:
    assert gc.isenabled()
    seen: list[bool] = []
    f = optimize(lambda x: torch.relu(x) * 2, _recording_backend(seen))
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.relu(x) * 2)
    assert seen == [False]
    assert gc.isenabled()
    f(x)  # a cache hit compiles nothing
    assert seen == [False] and gc.isenabled()


def test_gc_is_restored_when_the_backend_raises() -> None:
    def failing(gm, example_inputs):
        raise RuntimeError("backend failed")

    f = optimize(lambda x: x + 1, failing)
    with pytest.raises(RuntimeError, match="backend failed"):
        f(torch.randn(3))
    assert gc.isenabled()


def test_gc_left_off_by_the_program_stays_off() -> None:
    seen: list[bool] = []
    f = optimize(lambda x: x - 1, _recording_backend(seen))
    gc.disable()
    try:
        f(torch.randn(3))
        assert seen == [False] and not gc.isenabled()
    finally:
        gc.enable()
