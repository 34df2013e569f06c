"""Modules with RNG-initialised parameters built inside compiled code (``nn.Linear`` in a forward):
a logged graph break at the construction, which runs in Python on every call, so every call gets
new weights drawn from torch's generator exactly as eager draws them; never weights cached from the
capture. (Stateless modules, losses and activations, stay in the graph: corpus_python2.py.)"""

import torch
from torch import nn

import kiln.capture as kc

from .conftest import Recorder


def linear_in_forward(x):
    lin = nn.Linear(4, 4)
    return torch.relu(lin(x)) * 2


def sequential_in_forward(x):
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return seq(x).sum(0)


class Head(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = nn.Linear(n, 3)

    def forward(self, x):
        return self.proj(x).softmax(-1)


def user_module_in_forward(x):
    return Head(4)(x) + nn.Embedding(10, 3)(torch.arange(3)).sum()


PROGRAMS = [linear_in_forward, sequential_in_forward, user_module_in_forward]


def _compare_seeded(fn, calls):
    kc.reset()
    opt = kc.optimize(fn, Recorder())
    outs = []
    for i in range(calls):
        x = torch.randn(3, 4)
        torch.manual_seed(i)
        want, want_next = fn(x), torch.rand(3)
        torch.manual_seed(i)
        got, got_next = opt(x), torch.rand(3)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got_next, want_next, rtol=0, atol=0)  # the generator advanced as eager's
        outs.append(got)
    return outs


def test_each_call_builds_new_weights_as_eager_does():
    for fn in PROGRAMS:
        outs = _compare_seeded(fn, calls=4)
        assert not torch.allclose(outs[0], outs[1]), fn.__name__  # new weights per call, never cached


def test_one_seed_then_several_calls_draws_the_same_stream():
    for fn in PROGRAMS:
        kc.reset()
        opt = kc.optimize(fn, Recorder())
        xs = [torch.randn(3, 4) for _ in range(3)]
        torch.manual_seed(5)
        want = [fn(x) for x in xs]
        torch.manual_seed(5)
        got = [opt(x) for x in xs]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_past_the_recompile_limit_still_exact():
    _compare_seeded(linear_in_forward, calls=11)


def test_the_break_is_logged_with_its_reason():
    for fn, name in [(linear_in_forward, "Linear"), (sequential_in_forward, "Linear"),
                     (user_module_in_forward, "Head")]:
        ex = kc.explain(fn)(torch.randn(3, 4))
        assert ex.break_count >= 1, ex.as_text()
        assert f"constructing module {name}" in ex.as_text(), ex.as_text()


def test_stateless_module_stays_in_the_graph():
    def f(x, y):
        return nn.Sequential(nn.ReLU(), nn.Tanh())(x) + nn.MSELoss()(x, y)
    ex = kc.explain(f)(torch.randn(3), torch.randn(3))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()
