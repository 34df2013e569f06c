"""NumPy's random numbers in compiled code (numpy_random.py): every draw gives eager NumPy's values
and leaves NumPy's generator state exactly where eager leaves it, call after call (the state is
checked by drawing after each call), with seeds inside and outside the compiled code; what cannot
be modelled breaks the graph and still gives eager's values and state."""

import copy
import itertools

import numpy as np
import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same


def _draw_state() -> np.ndarray:
    return np.random.rand(4)


def _check_global(fn, make_args, calls=4, graphs=None, breaks=0):
    """Each call: the same seed before eager and compiled; outputs and the state after must agree."""
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec)
    outs = []
    for i in range(calls):
        args = make_args()
        eager_args = copy.deepcopy(args)
        np.random.seed(100 + i)
        want, want_next = fn(*eager_args), _draw_state()
        np.random.seed(100 + i)
        got, got_next = opt(*args), _draw_state()
        assert_same(got, want)
        assert_same(args, eager_args)
        np.testing.assert_array_equal(got_next, want_next)  # the state advanced exactly as eager's
        outs.append(got)
    if graphs is not None:
        assert rec.count == graphs, rec.count
    np.random.seed(0)
    assert kc.explain(fn)(*make_args()).break_count == breaks
    return outs


def _x():
    return (torch.randn(3, 4),)


def test_draws_are_graph_inputs_made_per_call():
    def f(x):
        a = x.numpy()
        return a + np.random.rand(3, 4) * 2 + np.random.randn(3, 4).astype(np.float32)
    outs = _check_global(f, _x, graphs=1)
    assert not np.allclose(outs[0], outs[1])  # fresh draws on every call, never the capture's


def test_unseeded_calls_continue_the_stream():
    """No seed between calls: compiled and eager draw the same sequence from one starting state."""
    def f(x):
        return x.numpy() * np.random.uniform(-1.0, 1.0, size=(3, 4))
    kc.reset()
    opt = kc.optimize(f, Recorder())
    xs = [torch.randn(3, 4) for _ in range(3)]
    np.random.seed(7)
    want = [f(x) for x in xs]
    np.random.seed(7)
    got = [opt(x) for x in xs]
    for g, w in zip(got, want):
        assert_same(g, w)


def test_seeds_inside_compiled_code():
    def f(x):
        np.random.seed(3)
        a = np.random.rand(3, 4)
        np.random.seed(4)
        b = np.random.normal(0.0, 2.0, (3, 4))
        np.random.seed(5)  # no draw follows in this graph: replayed after it
        return x.numpy() + a - b
    _check_global(f, _x, graphs=1)


def test_unused_draw_still_advances_the_state():
    def f(x):
        np.random.randint(0, 10, size=5)
        return x * 2
    _check_global(f, _x, graphs=1)


def test_draw_arguments_from_shapes_and_numpy_dtypes():
    def f(x):
        a = x.numpy()
        return a + np.random.random_sample(a.shape), np.random.randint(0, 5, size=(2,), dtype=np.int32)
    _check_global(f, _x, graphs=1)


def test_generator_and_randomstate_arguments():
    def f(x, rng, rs):
        return x.numpy() + rng.normal(size=(3, 4)) + rng.random((3, 4), dtype=np.float32) + rs.rand(3, 4)
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(f, rec)
    for i in range(3):
        x = torch.randn(3, 4)
        r1, r2 = np.random.default_rng(i), np.random.default_rng(i)
        s1, s2 = np.random.RandomState(i), np.random.RandomState(i)
        assert_same(opt(x, r2, s2), f(x, r1, s1))
        np.testing.assert_array_equal(r1.random(3), r2.random(3))
        np.testing.assert_array_equal(s1.rand(3), s2.rand(3))
    assert rec.count == 1


def test_randomstate_seed_method():
    def f(x, rs):
        rs.seed(11)
        return x.numpy() + rs.randint(0, 10, size=4)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for _ in range(3):
        x = torch.randn(4)
        s1, s2 = np.random.RandomState(0), np.random.RandomState(0)
        assert_same(opt(x, s2), f(x, s1))
        np.testing.assert_array_equal(s1.rand(2), s2.rand(2))


@pytest.mark.parametrize("body, reason", [
    (lambda x: x.numpy() + np.exp(np.random.rand()), "of a number drawn by numpy random"),
    (lambda x: x * float(np.random.rand()), "data-dependent float()"),
    (lambda x: x * 2 if np.random.rand() < 0.5 else x - 1, "data-dependent"),
    (lambda x: x / np.random.randint(1, 4), "by a number drawn by numpy random"),
    (lambda x: x * (1.0 / np.random.rand()), "by a number drawn by numpy random"),
    (lambda x: x * np.random.rand() ** 2, "pow with a number drawn by numpy random"),
    (lambda x: x.half() * np.random.rand(), "and a float16 tensor"),
    (lambda x: x.numpy().astype(np.int8) + np.random.randint(0, 100), "and a int8 array"),
    (lambda x: x.numpy() + np.random.default_rng(0).integers(0, 3), "making a NumPy generator"),
    (lambda x: x.numpy() + np.random.normal(x.numpy()), "not a constant"),
    (lambda x: (np.random.shuffle(x.numpy()), x + 1)[1], "generator state"),
    (lambda x: (x + 1, np.random.get_state()[1][:3]), "generator state"),
])
def test_what_cannot_be_modelled_breaks_and_stays_exact(body, reason):
    def f(x):
        return body(x)
    kc.reset()
    ex = kc.explain(f)(torch.randn(3, 4))
    assert ex.break_count >= 1 and reason in ex.as_text(), ex.as_text()
    _check_global(f, _x, breaks=ex.break_count)


def helper(x):
    r = np.random.rand(3)
    if x.sum() > 0:  # data-dependent: the call breaks inside this callee
        return x + torch.from_numpy(r)
    return x - torch.from_numpy(r)


def test_draw_in_a_callee_that_breaks_is_not_drawn_twice():
    """The callee is rolled back and runs in Python: its draw must not also run before the graph."""
    def f(x):
        return helper(x * 2) + np.random.rand(3).sum()
    signs = itertools.cycle([1, -1])
    _check_global(f, lambda: (torch.randn(3, dtype=torch.float64).abs() * next(signs),), breaks=2)


def test_draw_is_an_input_in_the_printed_graph():
    def f(x):
        return x.numpy() + np.random.rand(3, 4)
    text = kc.capture_graph(f, (torch.randn(3, 4),), {}).as_text()
    assert "random.mtrand._rand.rand(3, 4)" in text


def helper_same_draws(x):
    a = np.random.rand(3)
    b = np.random.rand(3)  # the same call text twice
    if x.sum() > 0:
        return x + torch.from_numpy(a - b)
    return x - torch.from_numpy(a + b)


def test_two_identical_draws_in_a_rolled_back_callee():
    def f(x):
        np.random.rand(3)  # a draw of the same text kept in the graph
        return helper_same_draws(x * 2)
    signs = itertools.cycle([1, -1])
    _check_global(f, lambda: (torch.randn(3, dtype=torch.float64).abs() * next(signs),), breaks=2)


SCALAR_DRAWS = [
    lambda x: x.numpy() + np.random.rand(),  # a Python float: weak, the array stays float32
    lambda x: x * np.random.uniform(0.5, 1.5),
    lambda x: x + np.random.randint(0, 10),
    lambda x: x.numpy() * (np.random.rand() * 2 - 1) + np.random.randint(0, 5) // 2 - np.random.normal(),
    lambda x: (x + 1, np.random.rand(), np.random.randint(0, 10), np.random.normal() > 0, -np.random.rand()),
    lambda x: np.arange(3) + np.random.randint(0, 4) + np.random.random(),  # int64 array, then float64
    lambda x: x.double() - np.random.rand() + np.random.random() / 3,
    lambda x: x.numpy()[np.random.choice(3)],  # a NumPy int scalar as an index: a NumPy scalar result
    lambda x: (x.numpy() > np.random.rand(), np.random.randint(5) * x.numpy()),
]


@pytest.mark.parametrize("fn", SCALAR_DRAWS)
def test_scalar_draws_are_graph_inputs_made_per_call(fn):
    """``np.random.rand()`` (a Python float), ``randint(0, 10)`` (a Python int), ``choice(3)`` (a
    NumPy int): drawn before the graph on every call like array draws; the values, their Python or
    NumPy types and NumPy's state afterwards equal eager's, in one graph without a break."""
    outs = _check_global(fn, _x, calls=5, graphs=1)
    assert len({repr(o) for o in outs}) > 1  # fresh draws per call, never the capture's


def test_scalar_draw_unseeded_stream_and_python_types():
    def f(x):
        r, k = np.random.rand(), np.random.randint(0, 100)
        return x.numpy() * r + k, r, k, r * 2 + k
    kc.reset()
    opt = kc.optimize(f, Recorder())
    xs = [torch.randn(3) for _ in range(4)]
    np.random.seed(9)
    want = [f(x) for x in xs]
    np.random.seed(9)
    got = [opt(x) for x in xs]
    for g, w in zip(got, want):
        assert [type(v) for v in g] == [type(v) for v in w], (g, w)
        assert_same(g, w, atol=0)
