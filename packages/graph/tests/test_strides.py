"""kiln.graph.view_strides answers as torch's view does (strides, or no view possible)."""

from __future__ import annotations

import itertools

import torch

from kiln.graph import view_strides

CASES = [
    ((2, 3, 4), None, (6, 4)), ((2, 3, 4), None, (24,)), ((2, 3, 4), (1, 2, 6), (6, 4)),
    ((2, 3, 4), (12, 1, 3), (2, 12)), ((4, 1, 5), (5, 7, 1), (2, 2, 5)), ((3, 4), (1, 3), (12,)),
    ((3, 4), (1, 3), (3, 2, 2)), ((2, 1, 3), (3, 3, 1), (2, 3, 1)), ((), None, (1, 1)),
    ((2, 0, 3), None, (0, 6)), ((2, 0, 3), (9, 3, 1), (2, 0, 3)), ((8,), (2,), (2, 4)),
]


def _tensor(shape, strides):
    base = torch.arange(1000.0)
    return base.as_strided(shape, strides) if strides is not None else torch.empty(shape)


def test_matches_torch_view() -> None:
    for shape, strides, new in CASES:
        t = _tensor(shape, strides)
        got = view_strides(list(t.shape), list(t.stride()), list(new))
        try:
            want = list(t.view(new).stride())
        except RuntimeError:
            want = None
        assert got == want, (shape, t.stride(), new, got, want)


def test_all_small_reshapes_of_a_transpose() -> None:
    t = torch.empty(4, 6).t()  # (6, 4) with strides (1, 6)
    for a, b in itertools.product(range(1, 25), repeat=2):
        if a * b != 24:
            continue
        try:
            want = list(t.view(a, b).stride())
        except RuntimeError:
            want = None
        assert view_strides([6, 4], [1, 6], [a, b]) == want, (a, b)
