"""Compiled code that changes what a caller's tensor *is*, not only its values, called again and again
with fresh inputs against eager.

``x.requires_grad_()``: the caller's tensor gets the flag and, after backward, its gradient. Before, the
flag changed only on the graph's copy: the output required grad, the caller's tensor did not, and its
``.grad`` stayed None after backward. ``x.resize_(...)``: the caller's tensor has the new shape. Before,
the graph's new value could not be copied back into the old shape (an error where eager ran).
``x.t_()``, ``x.unsqueeze_(0)`` and the other in-place views of a caller's tensor: its new shape. Before,
the aot_eager backend raised where eager ran, and the inductor backend ran the whole graph op by op. And
a clock read inside compiled code is read on every call."""

from __future__ import annotations

import datetime
import time

import pytest
import torch

import kiln


def _flag_then_use(x):
    x.requires_grad_()
    return (x * 2).square().sum()


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_requires_grad_set_inside_reaches_the_callers_tensor(backend):
    kiln.reset()
    compiled = kiln.compile(_flag_then_use, backend=backend)
    for _ in range(3):
        x = torch.randn(4)
        ref = x.clone()
        got, want = compiled(x), _flag_then_use(ref)
        assert x.requires_grad and ref.requires_grad
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        assert x.grad is not None
        torch.testing.assert_close(x.grad, ref.grad)


def test_requires_grad_already_set_keeps_one_graph():
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(_flag_then_use)
    x = torch.randn(4, requires_grad=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, 8 * x.detach())
    assert kiln.stats().graph_breaks == 0


def _resize_then_use(x):
    x.resize_(2, 3)
    return x * 2


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_resize_inside_reaches_the_callers_tensor(backend):
    kiln.reset()
    compiled = kiln.compile(_resize_then_use, backend=backend)
    for n in (6, 6, 8):
        x = torch.randn(n)
        ref = x.clone()
        got, want = compiled(x), _resize_then_use(ref)
        assert x.shape == ref.shape == (2, 3)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, ref)


def _stamped(x):
    return x + time.time()


def _dated(x):
    return x * datetime.datetime.now().microsecond


def test_a_clock_read_inside_compiled_code_is_read_on_every_call():
    """``time.time()`` ran once at capture and its value was a constant of the graph: every later call
    returned the capture's time."""
    kiln.reset()
    compiled = kiln.compile(_stamped)
    seen = []
    for _ in range(3):
        before = time.time()
        seen.append(compiled(torch.zeros(1, dtype=torch.float64)).item())
        assert before <= seen[-1] <= time.time()
        time.sleep(0.01)
    assert seen == sorted(seen) and len(set(seen)) == 3
    days = kiln.compile(_dated)
    got = set()
    for _ in range(3):
        got.add(days(torch.ones(1, dtype=torch.float64)).item())
        time.sleep(0.002)
    assert len(got) > 1


def _seeded(x):
    return x + torch.initial_seed()


def test_the_seed_read_inside_compiled_code_follows_manual_seed():
    kiln.reset()
    compiled = kiln.compile(_seeded)
    for seed in (1, 2, 7):
        torch.manual_seed(seed)
        assert compiled(torch.zeros(1, dtype=torch.float64)).item() == seed


INPLACE_VIEWS = {
    "t_": (lambda x: x.t_(), (2, 3)),
    "transpose_": (lambda x: x.transpose_(0, 1), (2, 3)),
    "unsqueeze_": (lambda x: x.unsqueeze_(0), (3,)),
    "squeeze_": (lambda x: x.squeeze_(), (1, 3)),
    "as_strided_": (lambda x: x.as_strided_((2,), (2,)), (4,)),
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(INPLACE_VIEWS))
def test_an_inplace_view_of_a_callers_tensor_runs_in_python_and_the_rest_compiles(backend, name):
    change, shape = INPLACE_VIEWS[name]

    def reshape_then_use(x):
        y = x * 3  # a graph before the break
        change(x)
        return x + 1, y

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(reshape_then_use, backend=backend)
    for _ in range(3):
        x = torch.randn(shape)
        ref = x.clone()
        got, want = compiled(x), reshape_then_use(ref)
        assert x.shape == ref.shape and x.stride() == ref.stride()
        torch.testing.assert_close(got, want)
    stats = kiln.stats()
    assert stats.graph_breaks >= 1 and stats.graphs_run_eagerly == 0 and stats.frames_run_eagerly == 0, stats
