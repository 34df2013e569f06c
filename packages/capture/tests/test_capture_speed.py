"""What keeps a capture cheap (warm starts spend most of their time capturing): each a behaviour
check against eager plus a count of the work it saves."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln.capture as kc
from kiln.capture.shape_rules.functions import fast_result

from .conftest import assert_same


def _count_fake_ops(monkeypatch) -> list[str]:
    """Names of the aten ops dispatched to any FakeTensorMode from now on (outermost only)."""
    seen: list[str] = []
    real = FakeTensorMode.__torch_dispatch__
    depth = [0]

    def counting(self, func, types, args=(), kwargs=None):
        if depth[0] == 0:
            seen.append(str(func))
        depth[0] += 1
        try:
            return real(self, func, types, args, kwargs)
        finally:
            depth[0] -= 1
    monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", counting)
    return seen


def positions(x):
    pos = torch.arange(x.shape[-1], dtype=torch.float32)
    return x * pos + torch.zeros(x.shape[-1]) + torch.full((1,), 2.0)


def test_a_factory_call_runs_on_fake_tensors_once(recorder, monkeypatch):
    seen = _count_fake_ops(monkeypatch)
    g = kc.optimize(positions, recorder, fullgraph=True)
    x = torch.randn(3, 5)
    got = g(x)
    monkeypatch.undo()
    assert_same(got, positions(x))
    assert recorder.count == 1
    # zeros, full: each probed once (no traced input) and that result recorded; arange: its shape rule
    assert seen.count("aten.arange.start_step") + seen.count("aten.arange.default") == 0, seen
    assert seen.count("aten.zeros.default") + seen.count("aten.full.default") <= 2, seen
    gm = recorder.graphs[-1]
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.arange in targets and torch.zeros in targets and torch.full in targets


ARANGE_CASES = [((5,), {}), ((2, 9), {}), ((2, 9, 3), {}), ((9, 2, -2), {}), ((0,), {}), ((3, 3), {}),
                ((7, 1, -1), {}), ((5,), {"dtype": torch.float32}), ((1, 6), {"dtype": torch.int32}),
                ((4,), {"dtype": torch.float64, "layout": torch.strided, "pin_memory": False}),
                ((5,), {"device": "cpu"}), ((5,), {"device": torch.device("cpu")}), ((3,), {"device": "cuda"}),
                ((2, 8), {"device": "cuda:0", "requires_grad": False})]


def _meta(t):
    return (type(t).__name__, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device,
            t.requires_grad, t.is_leaf)


@pytest.mark.parametrize("args,kwargs", ARANGE_CASES, ids=str)
def test_arange_rule_matches_running_it(args, kwargs):
    with FakeTensorMode():
        fast = fast_result(torch.arange, args, kwargs)
        slow = torch.arange(*args, **kwargs)
    assert fast is not None and _meta(fast) == _meta(slow)


@pytest.mark.parametrize("args,kwargs", [((5.0,), {}), ((1, 2, 0), {}), ((5,), {"dtype": torch.bool}),
                                         ((5,), {"requires_grad": True, "dtype": torch.float32}),
                                         ((), {"end": 5}), ((True,), {}), ((5,), {"out": None})], ids=str)
def test_arange_rule_declines_what_it_is_not_sure_of(args, kwargs):
    with FakeTensorMode():
        assert fast_result(torch.arange, args, kwargs) is None


def _two_lines(x):
    y = x.sin()
    return y * 2


def test_each_node_keeps_its_own_source_line(recorder):
    """Location texts are made once per line at decode time: each node still names its line."""
    g = kc.optimize(_two_lines, recorder, fullgraph=True)
    x = torch.randn(3)
    assert_same(g(x), _two_lines(x))
    first = _two_lines.__code__.co_firstlineno
    traces = {n.target if isinstance(n.target, str) else n.target.__name__: n.meta.get("stack_trace")
              for n in recorder.graphs[-1].graph.nodes if n.op in ("call_method", "call_function")}
    assert traces["sin"] == f'  File "{__file__}", line {first + 1}, in _two_lines\n'
    assert traces["mul"] == f'  File "{__file__}", line {first + 2}, in _two_lines\n'
