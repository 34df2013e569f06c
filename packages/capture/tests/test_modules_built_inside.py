"""torch.nn modules with RNG-initialised parameters built inside compiled code (``nn.Linear`` in a
forward): the initialisation is graph work (module_init.py), one graph and no break, and every call
draws new weights from torch's generator exactly as eager draws them (the capture graph run as is:
bit for bit under the same seed, and the generator left where eager leaves it); never weights cached
from the capture. A module that outlives the graph is built in Python, with real Parameters. The
user's own module classes are built the same way, their ``__init__`` inlined. Stateless modules, losses and
activations: corpus_python2.py."""

import copy

import pytest
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


def mlp_in_forward(x):
    mlp = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.LayerNorm(16), nn.Dropout(0.0), nn.Linear(16, 3))
    return mlp(x).softmax(-1)


def conv_embedding_batchnorm_in_forward(x):
    img = x.reshape(3, 4, 1, 1).expand(3, 4, 5, 5)
    y = nn.Conv2d(4, 2, 3, padding=1)(img).mean((2, 3))
    bn = nn.BatchNorm1d(2)
    return bn(y) + nn.Embedding(10, 2)(torch.arange(3)) + bn.running_var


def attention_in_forward(x):  # xavier_uniform_ and constant_ in its _reset_parameters
    attn = nn.MultiheadAttention(4, 2, batch_first=True)
    return attn(x[None], x[None], x[None])[0][0]


class Head(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = nn.Linear(n, 3)

    def forward(self, x):
        return self.proj(x).softmax(-1)


def user_module_in_forward(x):
    return Head(4)(x) + nn.Embedding(10, 3)(torch.arange(3)).sum()


IN_GRAPH = [linear_in_forward, sequential_in_forward, mlp_in_forward, conv_embedding_batchnorm_in_forward,
            attention_in_forward]
IN_GRAPH.append(user_module_in_forward)
PROGRAMS = IN_GRAPH


def _compare_seeded(fn, calls, **options):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec, **options)
    outs = []
    for i in range(calls):
        x = torch.randn(3, 4)
        torch.manual_seed(i)
        want, want_next = fn(x), torch.rand(3)
        torch.manual_seed(i)
        got, got_next = opt(x), torch.rand(3)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got_next, want_next, rtol=0, atol=0)  # the generator advanced as eager's
        assert got.requires_grad == want.requires_grad, fn.__name__
        outs.append(got)
    return outs, rec


@pytest.mark.parametrize("fn", IN_GRAPH, ids=lambda f: f.__name__)
def test_one_graph_no_break(fn):
    ex = kc.explain(fn)(torch.randn(3, 4))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()
    assert "uniform_" in ex.as_text(), ex.as_text()  # the initialisation is in the graph


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_each_call_builds_new_weights_as_eager_does(fn):
    outs, _ = _compare_seeded(fn, calls=4)
    assert not torch.allclose(outs[0], outs[1]), fn.__name__  # new weights per call, never cached


@pytest.mark.parametrize("fn", IN_GRAPH, ids=lambda f: f.__name__)
def test_compiled_once_and_fresh_weights_without_reseeding(fn):
    """Ten calls, one graph; calls on the same input without a seed between them get new weights."""
    _, rec = _compare_seeded(fn, calls=10)
    assert rec.count == 1, rec.count
    kc.reset()
    opt = kc.optimize(fn, Recorder())
    x = torch.randn(3, 4)
    a, b = opt(x), opt(x)
    assert not torch.allclose(a, b)


def test_varying_batch_sizes_one_symbolic_graph():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(mlp_in_forward, rec)
    for i, n in enumerate([3, 5, 7, 2, 9]):
        x = torch.randn(n, 4)
        torch.manual_seed(i)
        want = mlp_in_forward(x)
        torch.manual_seed(i)
        torch.testing.assert_close(opt(x), want, rtol=0, atol=0)
    assert rec.count == 2, rec.count  # static, then symbolic on the second size


def test_fullgraph_accepts_it():
    _compare_seeded(mlp_in_forward, calls=3, fullgraph=True)


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
    _compare_seeded(user_module_in_forward, calls=11)


def test_gradients_flow_as_in_eager():
    def f(x, w):
        lin = nn.Linear(4, 3)
        return (lin(x * w) ** 2).sum()
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for i in range(3):
        x, w = torch.randn(2, 4), torch.randn(4, requires_grad=True)
        w2 = w.detach().clone().requires_grad_()
        torch.manual_seed(i)
        f(x, w).backward()
        torch.manual_seed(i)
        opt(x, w2).backward()
        torch.testing.assert_close(w2.grad, w.grad, rtol=0, atol=0)


def test_under_no_grad():
    def f(x):
        with torch.no_grad():
            y = nn.Linear(4, 4)(x)
        return y, nn.Linear(4, 2)(y)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for i in range(3):
        x = torch.randn(3, 4)
        torch.manual_seed(i)
        want = f(x)
        torch.manual_seed(i)
        got = opt(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
            assert g.requires_grad == w.requires_grad
    ex = kc.explain(f)(torch.randn(3, 4))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()


def test_seed_in_the_same_frame_breaks_before_the_draws():
    def f(x):
        torch.manual_seed(3)
        return nn.Linear(4, 2)(x)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for _ in range(3):
        x = torch.randn(3, 4)
        want, want_next = f(x), torch.rand(2)
        got, got_next = opt(x), torch.rand(2)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got_next, want_next, rtol=0, atol=0)
    ex = kc.explain(f)(torch.randn(3, 4))
    assert ex.break_count == 1 and "after torch.manual_seed" in ex.as_text(), ex.as_text()


def test_user_module_class_is_graph_work():
    ex = kc.explain(user_module_in_forward)(torch.randn(3, 4))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()
    assert "uniform_" in ex.as_text() and "normal_" in ex.as_text(), ex.as_text()  # Head's Linear, the Embedding


# ---- modules that outlive the graph: built in Python, real Parameters --------------------------------
def _assert_real_module(got, want):
    assert type(got) is type(want)
    for (n, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        assert type(p) is nn.Parameter and p.is_leaf and p.requires_grad, n
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def _seeded_pair(fn, opt, *args):
    torch.manual_seed(7)
    want = fn(*args)
    torch.manual_seed(7)
    return opt(*args), want


def test_returned_module_is_real_and_trains():
    def f(x):
        lin = nn.Linear(4, 3)
        return lin(x).sum(), lin
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for _ in range(3):
        x = torch.randn(2, 4)
        (got, got_lin), (want, want_lin) = _seeded_pair(f, opt, x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        _assert_real_module(got_lin, want_lin)
        got.backward()
        want.backward()
        torch.testing.assert_close(got_lin.weight.grad, want_lin.weight.grad, rtol=0, atol=0)
    ex = kc.explain(f)(torch.randn(2, 4))
    assert ex.break_count == 1 and "outlives the graph" in ex.as_text(), ex.as_text()


def test_returned_parameter_is_a_parameter():
    def f(x):
        lin = nn.Linear(4, 3)
        return lin(x), lin.weight
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for _ in range(3):
        (got, got_w), (want, want_w) = _seeded_pair(f, opt, torch.randn(2, 4))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert type(got_w) is nn.Parameter and got_w.is_leaf
        torch.testing.assert_close(got_w, want_w, rtol=0, atol=0)


class LazyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = None

    def forward(self, x):
        if self.head is None:
            self.head = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        return self.head(x)


def test_module_stored_on_self_is_real():
    kc.reset()
    got_m, want_m = LazyHead(), LazyHead()
    opt = kc.optimize(got_m, Recorder())
    for _ in range(3):
        x = torch.randn(3, 4)
        got, want = _seeded_pair(want_m, opt, x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        _assert_real_module(got_m.head, want_m.head)


_GLOBAL_MODULES: dict = {}


@kc.disable(reason="a graph break")
def _graph_break():
    return None


def test_module_stored_in_a_global_and_live_at_a_break():
    def f(x):
        _GLOBAL_MODULES["last"] = nn.Linear(4, 2)
        kept = nn.Linear(4, 4)  # live across the break: built in Python too
        _graph_break()
        inner = nn.Linear(2, 2)  # after the break, dies in the graph: graph work
        return inner(_GLOBAL_MODULES["last"](kept(x)))
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for i in range(4):
        x = torch.randn(3, 4)
        torch.manual_seed(i)
        want = f(x)
        want_m = _GLOBAL_MODULES["last"]
        torch.manual_seed(i)
        got = opt(x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        _assert_real_module(_GLOBAL_MODULES["last"], want_m)
        assert _GLOBAL_MODULES["last"] is not want_m
    ex = kc.explain(f)(torch.randn(3, 4))
    assert ex.as_text().count("outlives the graph") == 2, ex.as_text()


def test_fullgraph_refuses_an_escaping_module():
    def f(x):
        lin = nn.Linear(4, 3)
        return lin(x), lin
    kc.reset()
    with pytest.raises(kc.Unsupported, match="outlives the graph"):
        kc.optimize(f, Recorder(), fullgraph=True)(torch.randn(2, 4))


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


_COPIED = nn.Linear(4, 3)


def test_deepcopy_of_a_module_reads_each_calls_weights():
    """``copy.deepcopy(module)`` ran for real at capture time and baked that call's weights into the
    entry (later calls returned stale values); now it runs in Python on every call."""
    def f(x):
        built = nn.Linear(4, 3)
        return copy.deepcopy(_COPIED)(x) + copy.deepcopy(built)(x)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for i in range(4):
        with torch.no_grad():
            _COPIED.weight.add_(1.0)
        x = torch.randn(2, 4)
        torch.manual_seed(i)
        want = f(x)
        torch.manual_seed(i)
        torch.testing.assert_close(opt(x), want, rtol=0, atol=0)
    ex = kc.explain(f)(torch.randn(2, 4))
    assert "deepcopy() of a module holding parameters" in ex.as_text(), ex.as_text()
