"""Pointwise rules (shape_rules/pointwise.py): the same fake results as running the op, over many argument
sets, and capture uses them instead of torch's fake pointwise decompositions."""

import itertools
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln.capture as kc
from kiln.capture.shape_rules.pointwise import FAST_POINTWISE

from ..conftest import assert_same


def _meta(t):
    return (type(t).__name__, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device,
            t.requires_grad, t.is_leaf, t._is_view(), t._version)


def _tensors(mode, requires_grad=False):
    out = []
    for shape in [(5,), (1,), (2, 3), (4, 1, 6), (2, 3, 4), (1, 1, 4), (2, 1, 3, 1), (3, 1)]:
        for dtype in (torch.float32, torch.bfloat16):
            out.append(torch.randn(shape, dtype=dtype, requires_grad=requires_grad))
    out += [torch.randn(4, 6).t(), torch.randn(3, 8)[:, 1:5], torch.randn(2, 3, 4, 5).to(
        memory_format=torch.channels_last), torch.randn(1, 4).expand(3, 4), torch.randn(()),
        torch.randint(0, 5, (2, 3)), torch.ones(2, 3, dtype=torch.bool), torch.randn(2, 3, dtype=torch.float64),
        torch.empty_strided((2, 1, 3), (3, 100, 1))]
    return [mode.from_tensor(t) for t in out]


UNARY = [(F.relu, {}), (F.hardswish, {}), (F.hardsigmoid, {}), (F.silu, {}), (F.relu6, {}), (F.gelu, {}),
         (F.gelu, {"approximate": "tanh"}), (torch.tanh, {}), (torch.sigmoid, {}), (torch.rsqrt, {}),
         (torch.exp, {}), (torch.relu, {}), (torch.neg, {}), (operator.neg, {}), (torch.sqrt, {}),
         (F.sigmoid, {}), (F.tanh, {})]


def _check(fn, args, kwargs):
    """Rule vs ordinary path on fresh copies (in-place ops change their input's version)."""
    rule = FAST_POINTWISE[id(fn)]
    try:
        slow = fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return rule(args, kwargs) is None and None
    before = [a._version for a in args if isinstance(a, torch.Tensor)]
    fast = rule(args, kwargs)
    if fast is None:
        return None
    after = [a._version for a in args if isinstance(a, torch.Tensor)]
    assert _meta(fast)[:-1] == _meta(slow)[:-1], (fn, args, kwargs)
    assert (fast is args[0]) == (slow is args[0])
    if slow is args[0]:  # in place: the op bumped the version once, so does the rule
        assert after[0] == before[0] + 1
    return fast


@pytest.mark.parametrize("grad", [False, True])
def test_unary_rules_match_running_them(grad):
    mode = FakeTensorMode()
    taken = 0
    for t in _tensors(mode, requires_grad=grad):
        for fn, kwargs in UNARY:
            with mode:
                taken += _check(fn, (t,), kwargs) is not None
                if fn in (F.relu, F.hardswish, F.hardsigmoid, F.silu, F.relu6):
                    with torch.no_grad():  # in place on a leaf that requires grad: torch's error
                        copy = t.clone().detach()
                        taken += _check(fn, (copy, True), {}) is not None
                        copy = t.clone().detach()
                        taken += _check(fn, (copy,), {"inplace": True}) is not None
    assert taken > 100


def test_binary_rules_match_running_them():
    mode = FakeTensorMode()
    every = _tensors(mode) + _tensors(mode, requires_grad=True)
    ts = every[::3]  # pairs of a third of them (every layout and dtype kind still meets every other)
    others = [2, 0.5, -3, True, 1e300, None, "x"]
    taken = 0
    for op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.pow):
        for a, b in itertools.product(ts, repeat=2):
            with mode:
                taken += _check(op, (a, b), {}) is not None
        for a, b in itertools.product(every, others):
            with mode:
                taken += _check(op, (a, b), {}) is not None
                taken += _check(op, (b, a), {}) is not None
    assert taken > 300


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.act = nn.Hardswish(inplace=True)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        y = self.act(self.conv(x))
        y = y * self.gate(y.mean((2, 3), keepdim=True))
        return F.gelu(y * 0.5 + 1, approximate="tanh") / 2 - torch.tanh(y) ** 2


def test_capture_uses_the_pointwise_rules(recorder, monkeypatch):
    seen = []
    real = FakeTensorMode.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(str(func).split(".")[1])
        return real(self, func, types, args, kwargs)
    monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", counting)
    m = Block()
    g = kc.optimize(m, recorder, fullgraph=True)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        got = g(x)
        want = Block.forward(m, x)
    monkeypatch.undo()
    assert_same(got, want)
    assert recorder.count == 1
    slow = {"hardswish_", "hardswish", "hardsigmoid", "clamp", "clamp_min", "clamp_max", "add", "mul",
            "div", "sub", "pow", "tanh", "gelu"} & set(seen)
    assert not slow, seen
    targets = [getattr(n.target, "__name__", n.target) for n in recorder.graphs[-1].graph.nodes]
    assert "hardswish" in targets and "hardsigmoid" in targets and "gelu" in targets


def test_capture_with_grad_still_matches_eager(recorder):
    m = Block()
    g = kc.optimize(m, recorder, fullgraph=True)
    x = torch.randn(2, 3, 5, 5)
    got = g(x)
    want = Block.forward(m, x)
    assert_same(got, want)
    got.sum().backward()
    assert m.conv.weight.grad is not None
