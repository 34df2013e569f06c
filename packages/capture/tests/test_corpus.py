import copy

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same
from .corpus import CASES
from .corpus_registry import run_side


def _run_pair(case, opt, args, kwargs, seed):
    eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
    want = run_side(case, case.fn, eager_args, eager_kwargs, seed)
    got = run_side(case, opt, args, kwargs, seed)
    assert_same(got, want)
    # mutation of inputs is replayed: the inputs end up as eager left them
    assert_same((args, kwargs), (eager_args, eager_kwargs))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_program(case):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(case.fn, rec, dynamic=case.dynamic)
    factories = case.calls if case.calls is not None else (case.args, case.args)
    for seed, factory in enumerate(factories):
        torch.manual_seed(seed)
        _run_pair(case, opt, factory(), case.kwargs(), seed)
    assert rec.count == case.graphs, f"expected {case.graphs} graphs, got {rec.count}"
    if case.recompiles is not None:
        assert kc.recompile_count(opt) == case.recompiles
    torch.manual_seed(0)
    first = factories[0]
    ex = kc.explain(case.fn)(*first(), **case.kwargs())
    assert ex.break_count == case.breaks, ex.as_text()
