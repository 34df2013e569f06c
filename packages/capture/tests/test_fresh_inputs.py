"""No stale values: every corpus program called three times with fresh inputs (new data, same
shapes) gives eager's outputs and leaves its inputs as eager does. A value the trace read from
outside and baked into a cache entry (an array's contents, a set's length, an object built once)
shows up here as the first call's answer returned again."""

import collections
import copy

import numpy as np
import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same
from .corpus import CASES
from .corpus_registry import run_side

_FRESH_SEEDS = (1000, 1001, 1002)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fresh_inputs(case):
    kc.reset()
    opt = kc.optimize(case.fn, Recorder(), dynamic=case.dynamic)
    factories = case.calls if case.calls is not None else (case.args,)
    for factory in factories:
        for seed in _FRESH_SEEDS:
            torch.manual_seed(seed)
            args, kwargs = factory(), case.kwargs()
            eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
            want = run_side(case, case.fn, eager_args, eager_kwargs, seed)
            got = run_side(case, opt, args, kwargs, seed)
            assert_same(got, want)
            assert_same((args, kwargs), (eager_args, eager_kwargs))


def test_returned_object_is_fresh_per_call():
    """An object built in the compiled code is a new object on every call (not one shared copy)."""
    kc.reset()
    opt = kc.optimize(CASES[[c.name for c in CASES].index("stale_object_made_in_trace")].fn, Recorder())
    x = torch.randn(4, 4)
    first = opt(x, x)[1]
    first.v, first.log = 99, ["changed by the caller"]
    second = opt(x, x)[1]
    assert second is not first and second.v == 3 and second.log == ["made"]


def test_unrebuildable_value_runs_eagerly_and_says_why():
    def f(x):
        d = collections.deque([1, 2])
        return x + 1, d
    ex = kc.explain(f)(torch.randn(3))
    assert ex.graph_count == 0 and ex.eager_frames, ex.as_text()
    assert "deque" in ex.eager_frames[0].reason
    assert "ran eagerly" in repr(ex) and "deque" in repr(ex)


def test_numpy_array_mutated_between_calls():
    """The same ndarray object, changed in place between calls: each call sees its contents."""
    kc.reset()

    def f(x, a):
        return x * a.sum(), a.max()
    opt = kc.optimize(f, Recorder())
    x, a = torch.randn(3), np.arange(3.0)
    for i in range(3):
        a[:] = np.arange(3.0) * (i + 1)
        assert_same(opt(x, a), f(x, a))
