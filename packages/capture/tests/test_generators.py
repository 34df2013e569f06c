"""Generators inside compiled code (generators.py): traced lazily, and real generators wherever one
leaves the graph. Programs over tensors: corpus_generators.py."""

import contextlib
import copy
import inspect

import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same


def _gen(xs):
    for x in xs:
        yield x * 2


def _guarded(xs, log):
    try:
        for x in xs:
            yield x + 1
    finally:
        log.append("closed")


def _compare(fn, make_args, calls=3):
    kc.reset()
    opt = kc.optimize(fn, Recorder())
    for _ in range(calls):
        args = make_args()
        want, got = fn(*copy.deepcopy(args)), opt(*args)
        yield got, want


def test_returned_generator_is_real_and_unstarted():
    def f(x):
        return x + 1, _gen([x, x - 1])
    for (got_y, got_g), (want_y, want_g) in _compare(f, lambda: (torch.randn(3),)):
        assert inspect.isgenerator(got_g) and inspect.getgeneratorstate(got_g) == "GEN_CREATED"
        assert_same(got_y, want_y)
        assert_same(list(got_g), list(want_g))
    ex = kc.explain(f)(torch.randn(3))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()


def test_returned_started_generator_is_made_in_python():
    def f(x):
        g = _gen([x, x + 1, x + 2])
        first = next(g)
        return first, g
    for (got_a, got_g), (want_a, want_g) in _compare(f, lambda: (torch.randn(3),)):
        assert inspect.isgenerator(got_g)
        assert_same(got_a, want_a)
        assert_same(list(got_g), list(want_g))  # the rest, from where eager's stopped
    ex = kc.explain(f)(torch.randn(3))
    assert "generator _gen made in compiled code outlives the graph" in ex.as_text(), ex.as_text()


def test_dropped_generator_inside_try_runs_its_finally():
    """Eager closes a generator left suspended when it is dropped, running its ``finally``; kiln does
    not model GeneratorExit, so that frame runs eagerly (said in explain) and the log is eager's."""
    def f(x, log):
        out = x
        for t in _guarded([x, x * 2, x * 3], log):
            out = out + t
            if len(log) == 0:
                break
        log.append("after")
        return out
    for got, want in _compare(f, lambda: (torch.randn(3), [])):
        assert_same(got, want)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    x = torch.randn(3)
    log_eager, log_kiln = [], []
    f(x, log_eager)
    opt(x, log_kiln)
    assert log_kiln == log_eager == ["closed", "after"]
    ex = kc.explain(f)(x, [])
    assert ex.graph_count == 0 and "left suspended inside try/finally" in repr(ex), repr(ex)


def test_exhausted_generator_with_finally_is_one_graph():
    def f(x, log):
        return sum(_guarded([x, x * 2], log)), log
    for got, want in _compare(f, lambda: (torch.randn(3), [])):
        assert_same(got, want)
    ex = kc.explain(f)(torch.randn(3), [])
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()


def test_generator_function_as_the_compiled_function_runs_eagerly_and_says_so():
    """torch.compile captures no frame of a generator function either."""
    def top(x):
        yield x + 1
        yield x * 2
    kc.reset()
    opt = kc.optimize(top, Recorder())
    x = torch.randn(3)
    assert_same(list(opt(x)), list(top(x)))
    ex = kc.explain(top)(x)
    assert ex.graph_count == 0 and "generators and coroutines run eagerly" in repr(ex), repr(ex)


def test_fullgraph_names_the_break_inside_the_generator():
    def items(xs):
        for x in xs:
            yield x.sum().item()

    def f(x):
        return sum(items([x, x])) * x
    kc.reset()
    opt = kc.optimize(f, Recorder(), fullgraph=True)
    try:
        opt(torch.randn(3))
    except kc.Unsupported as e:
        assert "item" in str(e) and "in items" in str(e), str(e)
    else:
        raise AssertionError("fullgraph=True accepted a break inside a generator")


def _delegating(xs, log):
    yield from _guarded(xs, log)  # closing it closes the sub-generator, which runs its finally


def test_dropped_generator_inside_yield_from_runs_the_inner_finally():
    def f(x, log):
        g = _delegating([x, x * 2], log)
        first = next(g)
        del g  # eager: closed here, the inner finally runs
        log.append("after")
        return first
    for got, want in _compare(f, lambda: (torch.randn(3), [])):
        assert_same(got, want)
    kc.reset()
    opt = kc.optimize(f, Recorder())
    log_eager, log_kiln = [], []
    x = torch.randn(3)
    f(x, log_eager)
    opt(x, log_kiln)
    assert log_kiln == log_eager == ["closed", "after"]


LOG: list = []
SCALE = [2.0]


@contextlib.contextmanager
def _logged_scale(name):
    LOG.append(("enter", name))
    try:
        yield SCALE[0]
    finally:
        LOG.append(("exit", name))


def test_contextmanager_body_runs_on_every_call():
    """A ``contextlib.contextmanager``'s generator is the user's code: contextlib's helpers are
    inlined so its body is traced. Before, they ran for real at capture (contextlib is a library run
    for real without tensors): the global log was appended to on the first call only and the scale
    it yields stayed the first call's."""
    def f(x):
        with _logged_scale("a") as s:
            y = x * s
        return y + 1
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for scale in (2.0, 3.0, 3.0, 4.0):
        SCALE[0] = scale
        x = torch.randn(3)
        LOG.clear()
        want, want_log = f(x), list(LOG)
        LOG.clear()
        assert_same(opt(x), want)
        assert LOG == want_log == [("enter", "a"), ("exit", "a")]
