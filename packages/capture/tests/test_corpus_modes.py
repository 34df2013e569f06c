"""The corpus again under other capture modes: every size symbolic, and float64 inputs."""

import copy

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same
from .corpus import CASES, two
from .corpus_registry import run_side

STRAIGHT = [c for c in CASES if c.breaks == 0 and c.calls is None and c.dynamic is None]
# float64 inputs: programs over plain input tensors (modules hold float32 parameters)
FLOAT64 = [c for c in STRAIGHT if c.args is two and c.name not in ("chained_compare_tensor_meta",)]
# programs whose graph count differs when every size is symbolic: np.median/np.percentile pick their
# positions from the axis length, so over a symbolic axis they run in NumPy (a break each)
DYNAMIC_GRAPHS = {"np_median_traced": 2}


def _double(args):
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


@pytest.mark.parametrize("case", STRAIGHT, ids=[c.name for c in STRAIGHT])
def test_program_dynamic(case):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(case.fn, rec, dynamic=True)
    for seed in (0, 1):
        torch.manual_seed(seed)
        args = case.args()
        want = run_side(case, case.fn, copy.deepcopy(args), {}, seed)
        assert_same(run_side(case, opt, args, {}, seed), want)
    assert rec.count == DYNAMIC_GRAPHS.get(case.name, case.graphs)


@pytest.mark.parametrize("case", FLOAT64, ids=[c.name for c in FLOAT64])
def test_program_float64(case):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(case.fn, rec)
    torch.manual_seed(0)
    args = _double(case.args())
    want = run_side(case, case.fn, copy.deepcopy(args), {}, 0)
    assert_same(run_side(case, opt, args, {}, 0), want)
    assert rec.count == case.graphs
