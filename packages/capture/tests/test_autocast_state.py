"""A capture that stops inside ``with torch.autocast(...)`` leaves the autocast block it entered for real:
the frame runs eagerly and the caller's autocast state is what it was (it stayed on before)."""

from __future__ import annotations

import torch

import kiln.capture as kc


def _state() -> tuple:
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_autocast_enabled("cuda"))


def test_a_break_inside_autocast_leaves_the_autocast_state_as_it_was(recorder) -> None:
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print("a break inside autocast")  # noqa: T201 - the frame runs eagerly
            return y + 1
    before = _state()
    g = kc.optimize(f, recorder)
    for _ in range(3):
        x = torch.randn(4, 4)
        out = g(x)
        assert _state() == before  # was (True, bfloat16, ...) after the first call
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, f(x))
        after = torch.randn(4, 4) @ torch.randn(4, 4)  # the caller's own code: not autocast
        assert after.dtype == torch.float32


def test_nested_autocast_blocks_are_left_innermost_first(recorder) -> None:
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autocast("cpu", enabled=False):
                y = x @ x
                print("a break inside two autocast blocks")  # noqa: T201
            return (y @ x) + 1
    before = _state()
    g = kc.optimize(f, recorder)
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(g(x), f(x))
        assert _state() == before
