"""View rules (shape_rules/views.py): the same fake results as running the op, over many argument sets, and
capture uses them instead of torch's fake view implementations."""

import itertools
import operator
import random
from functools import partial

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln.capture as kc
from kiln.capture.shape_rules.views import FAST_METHODS, fast_getitem

from ..conftest import assert_same


def _meta(t):
    return (type(t).__name__, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device,
            t.requires_grad, t.is_leaf, t._is_view())


def _bases(rng, mode):
    """Fake tensors in many layouts: contiguous, transposed, sliced (offsets, steps), expanded,
    with size-1 dims, channels-last, 0-dim; the base tensor's storage is shared by the view."""
    out = []
    for shape in [(), (5,), (1,), (2, 3), (4, 1, 6), (2, 3, 4), (1, 1, 4), (3, 4, 5, 2), (2, 1, 3, 1)]:
        out.append(torch.randn(shape))
    out.append(torch.randn(4, 6).t())
    out.append(torch.randn(3, 8, 5)[:, 2:7:2])
    out.append(torch.randn(6, 4, 5).transpose(0, 2)[1:])
    out.append(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last))
    out.append(torch.randn(1, 4).expand(3, 4))
    out.append(torch.randn(2, 12)[:, 4:8])
    out.append(torch.randn(2, 6, 12).split(4, dim=2)[1])  # a GPT-2 qkv slice
    out.append(torch.randn(4, 3, 2).permute(2, 0, 1))
    for _ in range(12):  # random strided views of random bases
        base = torch.randn(rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 6))
        d = rng.randrange(3)
        view = base.transpose(d, rng.randrange(3))
        out.append(view.narrow(d, 0, max(1, view.shape[d] - 1)))
    return [mode.from_tensor(t) for t in out]


def _view_shapes(rng, t):
    n = t.numel()
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    shapes = [(n,), (-1,), tuple(t.shape), (*t.shape, 1), (1, *t.shape)]
    for _ in range(8):
        a = rng.choice(divisors)
        b = rng.choice([d for d in divisors if (n // a) % d == 0])
        shapes += [(a, n // a), (a, -1), (a, b, n // (a * b)), (1, a, 1, n // a), (-1, b)]
    return shapes


def _same_or_both_fail(fast_fn, slow_fn):
    """The rule's result equals the ordinary path's, or the rule declined (None)."""
    try:
        slow = slow_fn()
    except Exception:  # noqa: BLE001 - torch refuses: the rule must decline
        assert fast_fn() is None
        return None
    fast = fast_fn()
    if fast is not None:
        assert _meta(fast) == _meta(slow)
        assert fast.untyped_storage()._cdata == slow.untyped_storage()._cdata
    return fast


@pytest.mark.parametrize("method", ["view", "reshape"])
def test_view_rules_match_running_them(method):
    rng = random.Random(0)
    mode = FakeTensorMode()
    taken = 0
    for t in _bases(rng, mode):
        for shape in _view_shapes(rng, t):
            with mode:
                fast = _same_or_both_fail(partial(FAST_METHODS[method], t, (shape,), {}),
                                          partial(getattr(t, method), shape))
                _same_or_both_fail(partial(FAST_METHODS[method], t, shape, {}),
                                   partial(getattr(t, method), *shape))
            taken += fast is not None
    assert taken > 300  # the rule applies to most of them (not only declines)


def test_layout_rules_match_running_them():
    rng = random.Random(1)
    mode = FakeTensorMode()
    taken = 0
    for t in _bases(rng, mode):
        n = t.dim()
        cases = [("transpose", (a, b)) for a, b in itertools.product(range(-n - 1, n + 1), repeat=2)]
        cases += [("permute", tuple(p)) for p in itertools.permutations(range(n))]
        cases += [("permute", (0,) * n), ("permute", tuple(range(n + 1)))]
        cases += [("unsqueeze", (d,)) for d in range(-n - 2, n + 2)]
        cases += [("expand", tuple(t.shape)), ("expand", (2, *t.shape)), ("expand", (-1,) * n),
                  ("expand", tuple(3 if s == 1 else s for s in t.shape)),
                  ("expand", tuple(s + 1 for s in t.shape)), ("expand", (-1, *t.shape))]
        for name, args in cases:
            with mode:
                fast = _same_or_both_fail(partial(FAST_METHODS[name], t, args, {}),
                                          partial(getattr(t, name), *args))
            taken += fast is not None
    assert taken > 300


def _index_items(rng, size):
    return [0, -1, size - 1, size, -size - 1, None, Ellipsis, slice(None), slice(1, None), slice(None, -1),
            slice(None, None, 2), slice(-3, None), slice(1, 100), slice(-100, 2), slice(2, 1),
            slice(0, size, 3), slice(rng.randint(-4, 4), rng.randint(-4, 6), rng.randint(1, 3))]


def test_getitem_rule_matches_running_it():
    rng = random.Random(2)
    mode = FakeTensorMode()
    taken = 0
    for t in _bases(rng, mode):
        size = t.shape[0] if t.dim() else 1
        items = _index_items(rng, size)
        keys = list(items) + [(a, b) for a in items for b in items] + \
            [tuple(rng.choice(items) for _ in range(rng.randint(1, 4))) for _ in range(60)]
        keys += [(None, None, Ellipsis, 0), (Ellipsis, None), (True,), torch.tensor([0]), "a"]
        for key in keys:
            with mode:
                fast = _same_or_both_fail(partial(fast_getitem, t, key), partial(operator.getitem, t, key))
            taken += fast is not None
    assert taken > 800


def test_rules_decline_when_autograd_would_track_the_view():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(2, 6, requires_grad=True))
    with mode:
        assert FAST_METHODS["view"](x, (3, 4), {}) is None
        assert fast_getitem(x, (0, slice(1, 3))) is None
        with torch.no_grad():
            assert FAST_METHODS["view"](x, (3, 4), {}) is not None
        with torch.inference_mode():
            assert FAST_METHODS["view"](x, (3, 4), {}) is None
    y = mode.from_tensor(torch.randn(2, 6))
    with mode:
        assert FAST_METHODS["view"](y, (torch.float32,), {}) is None  # view(dtype)
        assert FAST_METHODS["view"](y, (3, 4), {"size": 1}) is None
        assert FAST_METHODS["view"](y, (0, -1), {}) is None


def _attention_like(x, w):
    b, t, _ = x.shape
    q, k, v = (x * w).split(8, dim=2)  # strided slices, as GPT-2's qkv split
    q = q.view(b, t, 2, 4).transpose(1, 2)
    k = k.view(b, t, 2, 4).permute(0, 2, 1, 3)
    att = (q + k)[:, :, -1:, None, 1:]
    return att.unsqueeze(0).expand(2, -1, -1, -1, -1, -1).reshape(2, 2, 2, 3), v.transpose(1, 2)[..., 0]


def test_capture_uses_the_view_rules(recorder, monkeypatch):
    seen = []
    real = FakeTensorMode.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return real(self, func, types, args, kwargs)
    monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", counting)
    g = kc.optimize(_attention_like, recorder, fullgraph=True)
    x, w = torch.randn(2, 5, 24), torch.randn(24)
    with torch.no_grad():
        got = g(x, w)
    monkeypatch.undo()
    assert_same(got, _attention_like(x, w))
    assert recorder.count == 1
    slow = [s for s in seen if s.split(".")[1] in ("view", "_unsafe_view", "slice", "select", "unsqueeze",
                                                    "transpose", "permute", "expand")]
    assert slow == [], slow
    assert "aten.as_strided.default" in seen
    targets = [n.target for n in recorder.graphs[-1].graph.nodes if n.op in ("call_method", "call_function")]
    assert targets.count("view") == 2 and "permute" in targets and "expand" in targets and \
        "reshape" in targets


def test_capture_with_grad_keeps_the_ordinary_path(recorder):
    g = kc.optimize(_attention_like, recorder, fullgraph=True)
    x, w = torch.randn(2, 5, 24), torch.randn(24, requires_grad=True)
    got = g(x, w)
    want = _attention_like(x, w)
    assert_same(got, want)
    assert got[0].grad_fn is not None and got[0].requires_grad
