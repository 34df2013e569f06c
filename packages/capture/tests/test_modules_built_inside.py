"""Modules with RNG-initialised parameters built inside compiled code (``nn.Linear`` in a forward):
a logged graph break at the construction, which runs in Python on every call, so every call gets
new weights drawn from torch's generator exactly as eager draws them; never weights cached from the
capture. (Stateless modules, losses and activations, stay in the graph: corpus_python2.py.)"""

import torch
from torch import nn

import kiln.capture as kc
from kiln.graph import EVENTS

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


def _counts():
    return dict(EVENTS.snapshot()[0])


def test_a_loop_of_calls_stops_compiling_after_warm_up():
    """The frame after the break receives a new module each call: after one recompile it is guarded
    by type, its parameters read as graph inputs, so later calls hit the cache (never the recompile
    limit, never a stale weight)."""
    for fn in PROGRAMS:
        kc.reset()
        EVENTS.reset()
        opt = kc.optimize(fn, Recorder())
        for i in range(10):
            if i == 5:
                warm = _counts()
            x = torch.randn(3, 4)
            torch.manual_seed(i)
            want = fn(x)
            torch.manual_seed(i)
            torch.testing.assert_close(opt(x), want, rtol=0, atol=0)
        after = _counts()
        for kind in ("GraphCaptured", "Recompile", "FrameRunEagerly"):
            assert after.get(kind, 0) == warm.get(kind, 0), (fn.__name__, kind, warm, after)
        assert after.get("Recompile", 0) <= after.get("GraphBreakEvent", 0), (fn.__name__, after)


def test_linear_in_forward_compiles_at_most_twice():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(linear_in_forward, rec)
    for i in range(10):
        x = torch.randn(3, 4)
        torch.manual_seed(i)
        want = linear_in_forward(x)
        torch.manual_seed(i)
        torch.testing.assert_close(opt(x), want, rtol=0, atol=0)
    assert rec.count <= 2, rec.count


def test_new_module_argument_each_call():
    """A module passed in new on every call: one graph serves them all, each with its own weights."""
    def f(m, x):
        return m(x).relu() + m.weight.sum()
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(f, rec)
    for _ in range(6):
        m, x = nn.Linear(4, 3), torch.randn(2, 4)
        torch.testing.assert_close(opt(m, x), f(m, x), rtol=0, atol=0)
    assert rec.count <= 2, rec.count


def test_new_module_that_differs_is_guarded():
    """What the trace read from a module guarded by type is still guarded: its sizes, its mode, an
    instance forward and hooks added later each recompile and give eager's values."""
    def f(m, x):
        return m(x) * 2
    kc.reset()
    opt = kc.optimize(f, Recorder(), recompile_limit=20)

    def hooked():
        m = nn.Linear(4, 3)
        m.register_forward_hook(lambda mod, args, out: out + 100)
        return m

    def own_forward():
        m = nn.Linear(4, 3)
        m.forward = lambda x: x[:, :3] - 7
        return m

    def dropout():
        m = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
        return m.train() if torch.rand(()) < 0.5 else m.eval()

    makers = [lambda: nn.Linear(4, 3), lambda: nn.Linear(4, 3), lambda: nn.Linear(4, 5),
              lambda: nn.Linear(4, 3, bias=False), hooked, lambda: nn.Linear(4, 3), own_forward,
              lambda: nn.Linear(4, 3).requires_grad_(False), lambda: nn.Linear(4, 3).double(),
              *[dropout] * 4, lambda: nn.Linear(4, 3)]
    for make in makers:
        m = make()
        x = torch.randn(2, 4, dtype=next(iter(m.parameters())).dtype)
        torch.manual_seed(0)
        want = f(m, x)
        torch.manual_seed(0)
        torch.testing.assert_close(opt(m, x), want, rtol=0, atol=0)


def test_parameter_replaced_between_calls():
    """``m.weight = nn.Parameter(...)`` between calls: a new tensor each call is read by source."""
    m = nn.Linear(4, 3)

    def f(x):
        return m(x).tanh()
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(f, rec)
    for _ in range(6):
        m.weight = nn.Parameter(torch.randn(3, 4))
        x = torch.randn(2, 4)
        torch.testing.assert_close(opt(x), f(x), rtol=0, atol=0)
    assert rec.count <= 2, rec.count


def test_new_stateless_modules_with_and_without_hooks():
    """Modules made and dropped each call can reuse a dead module's id: an entry keeps the objects
    its identity guards name alive, and a module guarded by type guards its hooks."""
    def f(m, x):
        return m(x) + 1
    kc.reset()
    opt = kc.optimize(f, Recorder(), recompile_limit=20)
    for i in range(12):
        m = nn.ReLU() if i % 3 else nn.Tanh()
        if i % 2:
            m.register_forward_hook(lambda mod, args, out: out * 10)
        x = torch.randn(5)
        torch.testing.assert_close(opt(m, x), f(m, x), rtol=0, atol=0)
        del m
