"""In-place writes through views of the caller's tensors (unfold, expand, dtype views and chains of
them): each program is called three times with fresh inputs, and its outputs (values, shapes, strides)
and its inputs after the call are compared with eager's.

Found by probing: a write through ``x.unfold(...)`` never reached ``x`` (the trace decomposed the view into
a gather, a copy); a write into a window of overlapping ``unfold`` windows was undone by the windows'
stale copies; a write through ``view_as_real`` failed at run time where eager runs, one through ``conj()``
reached its base unconjugated; an ``out=`` tensor that
eager resizes had the result written past its end (a crash)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _unfold_add(x):
    return x.unfold(0, 2, 2).add_(1)


def _unfold_window_add(x):
    return x.unfold(0, 2, 1)[1].add_(1)  # windows overlap; the written window does not overlap itself


def _unfold_zero_then_read(x):
    x.unfold(0, 3, 3).zero_()
    return x * 1


def _unfold_item(x):
    x.unfold(0, 2, 1)[1, 0] = 7.0
    return x + 0


def _expand_row(x):
    x.expand(3, 3)[0] = 5.0
    return x * 2


def _real_view(x):
    return torch.view_as_real(x).mul_(2)


def _real_slice(x):
    return torch.view_as_real(x)[:, 0].mul_(2)


def _rand(n: int, dtype: torch.dtype = torch.float32) -> Callable[[int], list[torch.Tensor]]:
    return lambda seed: [torch.randn(n, dtype=dtype, generator=torch.Generator().manual_seed(seed))]


def _conj_then_read(x):
    x.conj().mul_(2)  # a conjugate view: x becomes the conjugate of the view's new values
    return x * 1


def _conj_view(x):
    return x.conj().mul_(2)  # the output is the conjugate view itself


def _int_view(x):
    return x.view(torch.int32).add_(1)


PROGRAMS: list[tuple[Callable, Callable[[int], list[torch.Tensor]]]] = [
    (_unfold_add, _rand(6)),
    (_unfold_window_add, _rand(5)),
    (_unfold_zero_then_read, _rand(6)),
    (_unfold_item, _rand(5)),
    (_expand_row, _rand(3)),
    (_real_view, _rand(3, torch.complex64)),
    (_real_slice, _rand(4, torch.complex64)),
    (_conj_then_read, _rand(3, torch.complex64)),
    (_conj_view, _rand(3, torch.complex64)),
    (_int_view, _rand(4)),
]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize(("fn", "make"), PROGRAMS, ids=[f.__name__ for f, _ in PROGRAMS])
def test_writes_through_views_reach_the_callers_tensor(backend: str, fn: Callable, make: Callable) -> None:
    compiled = kiln.compile(fn, backend=backend)
    for i in range(3):
        ours, theirs = make(i), make(i)
        _same(fn(*theirs), compiled(*ours))
        _same(theirs, ours)


def _overlapping_windows(x):
    return x.unfold(0, 2, 1).add_(1)


def _expanded(x):
    return x.expand(2, 3).mul_(2)


@pytest.mark.parametrize(("write", "size"), [(_overlapping_windows, 5), (_expanded, 3)],
                         ids=["overlapping_unfold", "expand"])
def test_a_write_into_a_view_sharing_its_elements_runs_in_python(write: Callable, size: int) -> None:
    """Eager's element order decides the values (overlapping windows), or eager refuses (an expanded dim):
    the write runs in Python, as eager, and says so."""
    try:
        explained = kiln.explain(write)(torch.arange(float(size)))
    except RuntimeError as e:  # the write ran in Python and eager's refusal came out of it
        assert "more than one element of the written-to tensor" in str(e)
    else:
        assert any("share memory" in b.reason for b in explained.break_reasons), explained
    compiled = kiln.compile(write)
    for i in range(3):
        x = torch.arange(float(size)) + i
        y = x.clone()
        try:
            want = write(y)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=str(e)[:30]):
                compiled(x)
            continue
        _same(want, compiled(x))
        _same(y, x)


def _add_into(x, out):
    return torch.add(x, 1, out=out)


@pytest.mark.parametrize("out_shape", [(0,), (2, 2), (5,)], ids=["empty", "other_shape", "same_shape"])
def test_an_out_tensor_eager_resizes(out_shape: tuple) -> None:
    """``out=`` of other sizes than the result: eager resizes it (the graph, which writes values into an
    input's memory, wrote 5 elements into 0 and crashed). Such a call runs in Python."""
    compiled = kiln.compile(_add_into)
    for seed in range(3):
        x = _rand(5)(seed)[0]
        out, theirs = torch.zeros(out_shape), torch.zeros(out_shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's "an output with one or more elements was resized"
            want = _add_into(x, theirs)
            got = compiled(x, out)
        _same(want, got)
        _same(theirs, out)
        assert got.data_ptr() == out.data_ptr()


def _mul_by_transpose(x):
    return x.mul_(x.t())


def _add_shifted(x):
    return x[1:].add_(x[:-1])


def _mul_by_itself(x):
    return x.mul_(x)


def _iadd_shifted_columns(x):
    x[:, 1:] += x[:, :-1]  # eager adds column by column, each reading the one it just wrote
    return x


def _assign_shifted_columns(x):
    x[:, 1:] = x[:, :-1]
    return x * 2


@pytest.mark.parametrize("fn", [_mul_by_transpose, _add_shifted, _mul_by_itself, _iadd_shifted_columns,
                                _assign_shifted_columns], ids=lambda f: f.__name__)
def test_an_in_place_op_reading_another_view_of_what_it_writes_runs_as_eager(fn: Callable) -> None:
    """Eager refuses a partial overlap of an in-place op's input and output; a graph read the old values
    and returned a result. Such a write runs in Python (eager's error); reading exactly what it writes
    (``x.mul_(x)``) stays in the graph."""
    compiled = kiln.compile(fn)
    for seed in range(3):
        x = torch.randn(3, 3, generator=torch.Generator().manual_seed(seed))
        y = x.clone()
        try:
            want = fn(y)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match="single memory location"):
                compiled(x)
            assert "single memory location" in str(e)
            continue
        _same(want, compiled(x))
        _same(y, x)
    explained = kiln.explain(_mul_by_itself)(torch.randn(3, 3))
    assert explained.graph_count == 1 and explained.break_count == 0


def _swap_column_halves(x):
    x[:, :2].add_(x[:, 2:])
    x[:, 2:].mul_(x[:, :2])
    return x * 2


def _odd_times_even(x):
    return x[:, 1::2].mul_(x[:, ::2])


@pytest.mark.parametrize("fn", [_swap_column_halves, _odd_times_even], ids=lambda f: f.__name__)
def test_in_place_ops_between_interleaved_disjoint_views_stay_in_the_graph(fn: Callable) -> None:
    """Views of one memory whose byte spans meet but that share no element (column halves, odd and even
    columns) are read and written in one graph with eager's values (they broke the graph)."""
    compiled = kiln.compile(fn)
    for seed in range(3):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))
        y = x.clone()
        _same(fn(y), compiled(x))
        _same(y, x)
    explained = kiln.explain(fn)(torch.randn(5, 4))
    assert explained.graph_count == 1 and explained.break_count == 0
