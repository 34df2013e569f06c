"""Tensor arguments that alias each other (kiln.capture's aliasing.py), called again and again with fresh
inputs in both patterns, against eager: the outputs and every argument after the call.

Before: compiled for ``f(x, x)``, a call ``f(x, y)`` wrote ``y`` and left ``x`` alone (no recompile);
compiled for two tensors, ``f(x, x)`` read the value from before the write; two views of one memory,
one written, gave the other's stale values. The same between an argument and a tensor reached another
way: ``m(m.buf)`` with a forward that updates ``self.buf`` returned the value from before the update, or
after it where eager read the other. And the writes of foreach in-place ops (``torch._foreach_add_``) were
not seen at all (fake tensors do not count them). And a list's bound ``append`` reached as a value (the
resume function after an ``.item()`` break) was called for real at trace time: the caller's list got
symbolic floats (``zf14``) instead of numbers."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import kiln
from kiln.capture.aliasing import written_overlap_python
from kiln.graph import guards_native
from kiln.runtime import native_guards

BACKENDS = ["inductor", "eager"]


def _write_then_read(a, b):
    a.add_(1)
    return b * 2 + a


def _same_or_two(i: int, pattern: str) -> list[torch.Tensor]:
    x = torch.randn(4)
    same = pattern[i % len(pattern)] == "s"
    return [x, x] if same else [x, torch.randn(4)]


def _agree(fn, compiled, args: list) -> None:
    ref_args = copy.deepcopy(args)  # deepcopy keeps the aliasing between the arguments
    want = fn(*ref_args)
    got = compiled(*args)
    torch.testing.assert_close(got, want)
    for a, r in zip(args, ref_args):
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ["sdsd", "dsds", "ssdd"])
def test_a_tensor_passed_twice_and_written_agrees_with_eager_in_either_order(backend, pattern):
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(_write_then_read, backend=backend)
    for i in range(6):
        _agree(_write_then_read, compiled, _same_or_two(i, pattern))
    stats = kiln.stats()
    assert stats.graphs_compiled == 2 and stats.frames_run_eagerly == 0, stats  # one graph per pattern


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_passed_twice_and_only_read_stays_correct(backend):
    def add(a, b):
        return a * 3 + b

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(add, backend=backend)
    for i in range(6):
        _agree(add, compiled, _same_or_two(i, "sd"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_written_views_of_one_memory_run_in_python_and_say_why(backend, caplog):
    def scale_then_shift(a, b):
        a.mul_(2)
        return b + 1

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(scale_then_shift, backend=backend)
    with caplog.at_level(logging.INFO, logger="kiln.graph_breaks"):
        for _ in range(3):
            base = torch.randn(8)
            _agree(scale_then_shift, compiled, [base[:6], base[2:]])  # overlapping views
            x = torch.randn(8)
            _agree(scale_then_shift, compiled, [x[:6].clone(), x[2:].clone()])  # separate memory: compiled
            y = torch.randn(3, 4)
            _agree(scale_then_shift, compiled, [y, y[0]])  # a tensor and a view of it
    assert any("share memory" in r.getMessage() for r in caplog.records)
    assert kiln.stats().graphs_compiled >= 1
    out = kiln.explain(scale_then_shift)(*(lambda t: [t[:6], t[2:]])(torch.randn(8)))
    assert any("share memory" in f.reason for f in out.eager_frames), out


def test_written_views_of_one_memory_are_refused_under_fullgraph():
    def scale_then_shift(a, b):
        a.mul_(2)
        return b + 1

    kiln.reset()
    kiln.stats_reset()
    base = torch.randn(8)
    with pytest.raises(Exception, match="share memory"):
        kiln.compile(scale_then_shift, fullgraph=True)(base[:6], base[2:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_append_resumed_after_an_item_break_gets_the_numbers(backend):
    def log_sum(x, log):
        log.append(x.sum().item())  # a graph break; ``log.append`` is on the resume function's stack
        return x * 2

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(log_sum, backend=backend)
    want, got = [], []
    for _ in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x, got), log_sum(x, want))
    assert [type(v) for v in got] == [float] * 4, got
    assert got == pytest.approx(want, rel=1e-5)


def test_the_native_overlap_test_agrees_with_python():
    kiln.compile(lambda t: t + 1)(torch.ones(2))  # installs the native checker where it builds
    native = guards_native.current()
    if native is None:
        pytest.skip(f"no native guard checker here: {native_guards.reason()}")
    a, c = torch.randn(6), torch.randn(3)
    b = torch.empty(0)
    cases = [
        ([a, a[1:], c], (0, 1, 2), (0,)),  # a view of a written tensor
        ([a, a[1:], c], (0, 1, 2), (2,)),  # views of one memory, neither written
        ([a, c], (0, 1), (0,)),
        ([c, a, c], (0, 1, 2), (1,)),  # one object twice, not written
        ([c, a, c], (0, 1, 2), (0,)),  # one object twice, written
        ([b, b, a], (0, 1, 2), (0, 1)),  # no elements: no memory to share
        ([a.view(2, 3).t(), a.view(torch.int32), c], (0, 1, 2), (1,)),  # a transposed view, another dtype
        ([c, a, a[::2]], (1, 2), (0,)),  # positions pick the tensors out of the inputs
        ([a[:3], a[3:], c], (0, 1, 2), (0,)),  # disjoint parts of one memory: no overlap
        ([a[:4], a[3:], c], (0, 1, 2), (1,)),  # one element shared
        ([a[::2], a[1::2]], (0, 1), (0,)),  # interleaved: counted as overlapping
        ([a, a[1:], c], (0, 1, 2), (0,), 2),  # two pinned tensors are not compared
        ([a, c, a[1:]], (0, 1, 2), (0,), 2),  # a pinned written tensor and a loose view of it
        ([a, c, a[1:]], (0, 1, 2), (2,), 1),  # a loose written view of a pinned tensor
        ([a, a[1:], a[2:]], (0, 1, 2), (), 1),  # nothing written
    ]
    for values, positions, written, *fixed in cases:
        assert native.written_overlap(values, positions, written, *fixed) == \
            written_overlap_python(values, positions, written, *fixed), (positions, written, fixed)
    assert [native.written_overlap(*case) for case in cases] == \
        [True, False, False, False, True, False, True, True, False, True, True, False, True, True, False]


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", ["xbxb", "bxbx"])
def test_an_argument_that_is_a_buffer_the_forward_updates_agrees_with_eager(backend, order):
    kiln.reset()
    ref, mine = _Counter(), _Counter()
    compiled = kiln.compile(mine, backend=backend)
    for which in order * 2:
        x = torch.randn(4)
        want = ref(ref.count if which == "b" else x)
        got = compiled(mine.count if which == "b" else x.clone())
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine.count, ref.count)


class _ReadsItsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.ones(4))

    def forward(self, x):
        x.mul_(2)  # the caller's tensor written, the module's buffer read after it
        return self.w + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_argument_that_is_a_buffer_read_later_agrees_with_eager(backend):
    kiln.reset()
    ref, mine = _ReadsItsBuffer(), _ReadsItsBuffer()
    compiled = kiln.compile(mine, backend=backend)
    for which in "xwxwww":
        x = torch.randn(4)
        want = ref(ref.w if which == "w" else x)
        got = compiled(mine.w if which == "w" else x.clone())
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine.w, ref.w)


STATE = {"total": torch.zeros(3)}


def _accumulate(x):
    STATE["total"].add_(x.sum())
    return x + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_that_is_a_global_tensor_the_graph_writes_agrees_with_eager(backend):
    kiln.reset()
    compiled = kiln.compile(_accumulate, backend=backend)
    for which in "xgxgg":
        x = torch.randn(3)
        start = STATE["total"].clone()
        arg = STATE["total"] if which == "g" else x
        want_total = start + (start if which == "g" else x).sum()
        want_out = want_total + 1 if which == "g" else x + 1
        got = compiled(arg)
        torch.testing.assert_close(got, want_out)
        torch.testing.assert_close(STATE["total"], want_total)


def _foreach_bump_then_read(xs, y):
    torch._foreach_add_(xs, 1.0)
    return y * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_foreach_write_to_an_argument_read_through_another_agrees_with_eager(backend):
    kiln.reset()
    compiled = kiln.compile(_foreach_bump_then_read, backend=backend)
    for same in (False, True, False, True):
        a, b = torch.randn(4), torch.randn(4)
        args = [[a, b], a if same else torch.randn(4)]
        _agree(_foreach_bump_then_read, compiled, args)


class _FlatBuffers(torch.nn.Module):
    """Two buffers that are disjoint parts of one memory (as flattened RNN weights, or gradients in a
    DDP bucket), both updated in place: compiled whole (pinned tensors are not compared with each other)."""

    def __init__(self):
        super().__init__()
        flat = torch.zeros(8)
        self.register_buffer("a", flat[:4])
        self.register_buffer("b", flat[4:])

    def forward(self, x):
        self.a.add_(x)
        self.b.sub_(x)
        return self.a * self.b


def test_disjoint_views_of_one_memory_written_in_one_graph_stay_compiled():
    kiln.reset()
    kiln.stats_reset()
    ref, mine = _FlatBuffers(), _FlatBuffers()
    compiled = kiln.compile(mine)
    for _ in range(4):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), ref(x))
        torch.testing.assert_close(mine.a.untyped_storage().data_ptr(), mine.b.untyped_storage().data_ptr())
    torch.testing.assert_close(mine.a, ref.a)
    torch.testing.assert_close(mine.b, ref.b)
    stats = kiln.stats()
    assert stats.graphs_compiled == 1 and stats.graph_breaks == 0 and stats.frames_run_eagerly == 0, stats


def test_foreach_writes_to_disjoint_parts_of_one_gradient_bucket_stay_compiled():
    bucket = torch.randn(12)
    grads = [bucket[:4], bucket[4:10], bucket[10:]]  # gradients as views of one bucket (DDP's bucket views)

    def clip(gs, scale):
        torch._foreach_mul_(gs, scale)
        return torch.stack([g.sum() for g in gs])

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(clip)
    for _ in range(3):
        want_bucket = bucket * 0.5
        got = compiled(grads, 0.5)
        torch.testing.assert_close(bucket, want_bucket)
        torch.testing.assert_close(got, torch.stack([g.sum() for g in grads]))
    stats = kiln.stats()
    assert stats.graphs_compiled == 1 and stats.graph_breaks == 0 and stats.frames_run_eagerly == 0, stats
