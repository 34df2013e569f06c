"""kiln.stats(): real counts of graphs, breaks, recompiles, cache lookups and eager fallbacks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    kiln.stats_reset()
    yield
    kiln.reset()


@kiln.disable
def _opaque() -> None:
    """Runs in Python, never captured: calling it is a graph break."""


def _breaks(x):
    y = x.sin()
    _opaque()  # the break
    return y.cos() + 1


def test_a_snapshot_is_frozen_typed_data() -> None:
    s = kiln.stats()
    assert isinstance(s, kiln.CompileStats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.graph_breaks = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.compile_seconds["capture"] = 1.0  # type: ignore[index]


def test_a_break_makes_two_graphs_counted_once_however_often_it_runs(capsys) -> None:
    f = kiln.compile(_breaks, backend="aot_eager")
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(f(x), x.sin().cos() + 1)
    s = kiln.stats()
    assert (s.graphs_captured, s.graphs_compiled, s.graph_breaks, s.recompiles) == (2, 2, 1, 0)
    assert s.frames_run_eagerly == 0 and s.graphs_run_eagerly == 0
    assert s.compile_seconds["capture"] > 0 and s.compile_seconds["backend"] > 0
    # aot_eager traces ATen graphs, unless both came from a warm graph cache (KILN_CACHE_DIR kept between runs)
    assert s.compile_seconds.get("autograd", 0.0) > 0 or s.cache_hits == 2


def test_a_new_size_recompiles_each_frame_and_snapshots_subtract(capsys) -> None:
    f = kiln.compile(_breaks, backend="aot_eager")
    f(torch.randn(4))
    before = kiln.stats()
    for _ in range(3):
        x = torch.randn(5)
        torch.testing.assert_close(f(x), x.sin().cos() + 1)
    delta = kiln.stats() - before
    # the function and its resume function after the break both miss on the new size
    assert (delta.recompiles, delta.graphs_compiled, delta.graph_breaks) == (2, 2, 1)


def test_cache_hits_and_misses_of_the_graph_cache() -> None:
    def g(x):
        return torch.relu(x) * 3 - 1
    kiln.compile(g, backend="aot_eager")(torch.randn(6, 3))
    first = kiln.stats()
    assert first.cache_misses + first.cache_hits == 1  # a hit only if an earlier run stored it
    kiln.reset()  # forget the compiled entry: the next call captures again and finds the stored graph
    x = torch.randn(6, 3)
    torch.testing.assert_close(kiln.compile(g, backend="aot_eager")(x), torch.relu(x) * 3 - 1)
    delta = kiln.stats() - first
    assert (delta.cache_hits, delta.cache_misses, delta.graphs_compiled) == (1, 0, 1)


def test_a_frame_that_cannot_be_captured_is_counted_as_run_eagerly() -> None:
    def f(x):  # a generator function: its frame runs eagerly (logged)
        yield x @ x + 1
    cf = kiln.compile(f, backend="eager")
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(list(cf(x)), list(f(x)))
    s = kiln.stats()
    assert s.frames_run_eagerly >= 1 and s.graphs_compiled == 0


def test_a_generator_runs_eagerly_and_is_counted_once() -> None:
    def gen(x):
        yield x + 1
        yield x * 2
    g = kiln.compile(gen, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        out = list(g(x))
        torch.testing.assert_close(out[1], x * 2)
    s = kiln.stats()
    assert (s.frames_run_eagerly, s.graphs_captured) == (1, 0)


def test_explain_is_a_dry_run_and_not_counted(capsys) -> None:
    kiln.explain(_breaks)(torch.randn(3))
    assert kiln.stats() == kiln.CompileStats()


@torch.library.custom_op("kiln_stats_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _scale_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 2 + 0 * float(x.abs().max().item())  # reads a value: the joint trace cannot


_scale.register_autograd(_scale_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


def test_a_graph_the_backend_cannot_compile_is_counted_as_run_op_by_op() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    compiled = kiln.compile(lambda t: torch.ops.kiln_stats_test.scale(lin(t)).sum())
    for _ in range(3):
        x = torch.randn(3, 4)
        lin.zero_grad()
        compiled(x).backward()
        got = lin.weight.grad.clone()
        lin.zero_grad()
        torch.ops.kiln_stats_test.scale(lin(x)).sum().backward()
        torch.testing.assert_close(got, lin.weight.grad)
    s = kiln.stats()
    assert s.graphs_run_eagerly == 1 and s.graphs_compiled == 1
