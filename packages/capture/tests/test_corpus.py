import copy

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same
from .corpus import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_program(case):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(case.fn, rec)
    for seed in (0, 1):
        torch.manual_seed(seed)
        args = case.args()
        kwargs = case.kwargs()
        want = case.fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        got = opt(*args, **kwargs)
        assert_same(got, want)
    assert rec.count == case.graphs, f"expected {case.graphs} graphs, got {rec.count}"
    torch.manual_seed(0)
    ex = kc.explain(case.fn)(*case.args(), **case.kwargs())
    assert ex.break_count == case.breaks, ex.as_text()
