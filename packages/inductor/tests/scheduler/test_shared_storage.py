"""Extern calls that return a view of an argument (a fallback ``view_as_complex``; ``wait_tensor``
returns a collective's output itself) share that argument's storage (scheduler/memory.py): the
memory plan hands it to a later buffer only after the last of the names is read. Before, the viewed
buffer's memory went to the next buffer of its size while the view was still read: wrong values on
every call."""

from __future__ import annotations

import torch
from helpers import assert_close, compile_fn

from kiln.inductor import InductorOptions
from kiln.inductor.scheduler.memory import view_argument

OPTS = InductorOptions(fallback_unknown_ops=True)


def _complex_view_then_same_size_buffer(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = torch.view_as_complex(x * 2)  # a fallback: a view of the buffer x * 2
    y = torch.softmax(x @ w, dim=1) @ w  # a buffer of x * 2's size, stored while c is alive
    return torch.view_as_real(c * c) + 1, y


def test_view_returned_by_a_fallback_keeps_its_storage_alive() -> None:
    x, w = torch.randn(4, 2), torch.randn(2, 2)
    cg = compile_fn(_complex_view_then_same_size_buffer, x, w, options=OPTS)
    for seed in range(3):  # fresh inputs each call
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(4, 2, generator=g), torch.randn(2, 2, generator=g)
        for got, want in zip(cg.fn(x, w), _complex_view_then_same_size_buffer(x, w)):
            assert_close(got, want)


def test_view_argument_reads_the_schema() -> None:
    assert view_argument("aten.view_as_complex.default") == 0
    assert view_argument("aten.unfold.default") == 0
    assert view_argument("_c10d_functional.wait_tensor.default") == 0
    assert view_argument("aten.mm.default") is None
    assert view_argument("aten.add_.Tensor") is None  # in place: its own rule (memory.py ``aliased``)
    assert view_argument("kiln_inductor.no_such_op.default") is None
