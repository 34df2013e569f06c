"""Shape rules (shape_rules/functions.py): the same fake results as running the function, and capture uses them."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln.capture as kc
from kiln.capture.shape_rules.functions import fast_result

from ..conftest import assert_same


def _meta(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad, t.is_leaf)


CASES = [
    # (input shape, channels_last, input dtype, param dtype, training, x requires grad, w requires grad)
    ((2, 3, 5, 5), False, torch.float32, torch.float32, False, False, False),
    ((2, 3, 5, 5), True, torch.float32, torch.float32, False, False, False),
    ((2, 3, 5, 5), False, torch.float32, torch.float32, True, True, True),
    ((2, 3, 5, 5), True, torch.float32, torch.float32, True, False, True),
    ((2, 3, 5, 5), False, torch.bfloat16, torch.float32, False, False, False),
    ((2, 3, 5, 5), False, torch.float32, torch.float32, True, True, False),
    ((4, 3), False, torch.float32, torch.float32, True, False, True),
    ((2, 3, 7), False, torch.float64, torch.float64, False, False, False),
    ((2, 3, 2, 3, 4), True, torch.float32, torch.float32, True, True, True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("grad_mode", [True, False])
def test_batch_norm_rule_matches_running_it(case, grad_mode):
    shape, channels_last, dtype, pdtype, training, x_grad, w_grad = case
    mode = FakeTensorMode()
    x = torch.randn(shape, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    c = shape[1]
    w, b = torch.randn(c, dtype=pdtype, requires_grad=w_grad), torch.randn(c, dtype=pdtype)
    rm, rv = torch.zeros(c, dtype=pdtype), torch.ones(c, dtype=pdtype)
    fx_, fw, fb, frm, frv = (mode.from_tensor(t) for t in (x.requires_grad_(x_grad), w, b, rm, rv))
    with mode, torch.set_grad_enabled(grad_mode):
        fast = fast_result(F.batch_norm, (fx_, frm, frv, fw, fb, training, 0.1, 1e-5), {})
        slow = F.batch_norm(fx_, frm, frv, fw, fb, training, 0.1, 1e-5)
        fast_t = fast_result(torch.batch_norm, (fx_, fw, fb, frm, frv, training, 0.1, 1e-5, False), {})
    assert fast is not None and fast_t is not None
    assert _meta(fast) == _meta(slow) == _meta(fast_t)


def test_batch_norm_rule_declines_what_it_is_not_sure_of():
    mode = FakeTensorMode()
    x, w = mode.from_tensor(torch.randn(1, 3, 1, 1)), mode.from_tensor(torch.randn(3))
    wrong = mode.from_tensor(torch.randn(4))
    strided = mode.from_tensor(torch.randn(2, 3, 4, 8)[..., ::2])
    with mode:
        assert fast_result(F.batch_norm, (x, w, w, None, None, True), {}) is None  # 1 value/channel
        assert fast_result(F.batch_norm, (x, wrong, wrong), {}) is None  # torch reports the mismatch
        assert fast_result(F.batch_norm, (strided, w, w), {}) is None  # not dense
        assert fast_result(F.batch_norm, (x, w, w), {"eps": -1.0}) is None
        assert fast_result(F.batch_norm, (x, w, w), {"bogus": 1}) is None
        with torch.autocast("cpu"):
            assert fast_result(F.batch_norm, (x, w, w), {}) is None
    with mode, torch.inference_mode():
        assert fast_result(F.batch_norm, (x, w, w), {}) is None


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.bn1d = nn.BatchNorm1d(4)

    def forward(self, x):
        y = torch.relu_(self.bn(self.conv(x)))  # in place on batch_norm's result: a non-leaf
        return self.bn1d(y.mean((2, 3))) + y.requires_grad


@pytest.mark.parametrize("training", [True, False])
def test_capture_takes_the_shape_rule_and_matches_eager(recorder, monkeypatch, training):
    calls = []
    real = torch.batch_norm

    def counting(*args, **kwargs):
        calls.append(type(args[0]).__name__)
        return real(*args, **kwargs)

    model, ref = ConvBN().train(training), ConvBN().train(training)
    ref.load_state_dict(model.state_dict())
    g = kc.optimize(model, recorder, fullgraph=True)
    x = torch.randn(2, 3, 6, 6)
    monkeypatch.setattr(torch, "batch_norm", counting)  # what F.batch_norm calls on the slow path
    got = g(x)
    assert "FakeTensor" not in calls, "capture ran batch_norm on fake tensors instead of its shape rule"
    monkeypatch.undo()
    want = ref(x)
    assert_same(got, want)
    assert_same(model.bn.running_mean, ref.bn.running_mean)
    assert recorder.count == 1
    if training:
        got.sum().backward()
        want.sum().backward()
        assert_same(model.conv.weight.grad, ref.conv.weight.grad, atol=1e-4)


def test_batch_norm_user_error_still_raised_by_torch(recorder):
    model = nn.BatchNorm2d(3).train()
    g = kc.optimize(model, recorder)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        g(torch.randn(1, 3, 1, 1))


class Layers(nn.Module):
    """The same linear / layer_norm / conv shapes in every layer: what the memo is for."""

    def __init__(self):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.norms = nn.ModuleList(nn.LayerNorm(8) for _ in range(4))
        self.convs = nn.ModuleList(nn.Conv1d(3, 3, 3, padding=1) for _ in range(3))

    def forward(self, x, s):
        for lin, norm in zip(self.lins, self.norms):
            x = F.gelu(norm(lin(x))) + x
        for conv in self.convs:
            s = conv(s)
        return x.sum(-1, keepdim=True) * s.mean()


@pytest.mark.parametrize("grad", [True, False])
def test_repeated_calls_reuse_the_memoized_fake_result(recorder, monkeypatch, grad):
    from kiln.capture import torch_ops

    hits = []
    real = torch_ops.from_memo

    def counting(entry):
        out = real(entry)
        hits.append(out)
        return out
    monkeypatch.setattr(torch_ops, "from_memo", counting)
    model, x, s = Layers(), torch.randn(2, 5, 8), torch.randn(2, 3, 6)
    g = kc.optimize(model, recorder, fullgraph=True)
    with torch.set_grad_enabled(grad):
        got, want = g(x, s), model(x, s)
    # linear, layer_norm and gelu take their shape rules; conv hits twice (with grad the first
    # conv reads an input that does not require grad: another key)
    assert len(hits) == (1 if grad else 2), len(hits)
    assert all(h.requires_grad == grad for h in hits)
    assert_same(got, want)
    if grad:
        got.sum().backward()
        w1 = model.lins[1].weight.grad.clone()
        model.zero_grad()
        model(x, s).sum().backward()
        assert_same(w1, model.lins[1].weight.grad, atol=1e-4)


def test_memo_key_describes_everything_that_decides_the_result():
    from kiln.capture.shape_rules.functions import memo_key

    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(2, 8))
    w = mode.from_tensor(torch.randn(4, 8))
    wg = mode.from_tensor(torch.randn(4, 8).requires_grad_())
    xt = mode.from_tensor(torch.randn(8, 2)).t()  # same shape, other strides
    xd = mode.from_tensor(torch.randn(2, 8, dtype=torch.float64))
    keys = {memo_key(F.linear, (a, b), {}) for a, b in ((x, w), (x, wg), (xt, w), (xd, w))}
    assert None not in keys and len(keys) == 4
    with torch.no_grad():
        assert memo_key(F.linear, (x, wg), {}) not in keys  # grad mode is in the key
    assert memo_key(torch.addmm, (mode.from_tensor(torch.randn(4)), x, w.t()), {}) is not None
    assert memo_key(F.relu, (x,), {}) is None  # not a memoized function
    assert memo_key(F.linear, (x, w), {"bias": object()}) is None  # an argument it cannot describe
    with torch.inference_mode():
        assert memo_key(F.linear, (x, w), {}) is None


def _fake_input(mode, shape, layout, grad):
    x = torch.randn(shape)
    if layout == "permuted":  # ConvNeXt: (N, C, H, W) data read as (N, H, W, C)
        x = torch.randn(shape[0], shape[-1], *shape[1:-1]).movedim(1, -1)
    elif layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    return mode.from_tensor(x.requires_grad_(grad))


LAYOUT_CASES = [((3, 8), "contiguous"), ((8,), "contiguous"), ((2, 4, 8), "contiguous"),
                ((2, 5, 5, 8), "permuted"), ((2, 3, 4, 8), "channels_last"),
                ((2, 6, 8), "transposed"), ((0, 8), "contiguous")]


@pytest.mark.parametrize("shape,layout", LAYOUT_CASES)
@pytest.mark.parametrize("x_grad,w_grad,grad_mode", [(False, False, True), (True, False, True),
                                                     (False, True, True), (True, True, False)])
def test_linear_and_layer_norm_rules_match_running_them(shape, layout, x_grad, w_grad, grad_mode):
    mode = FakeTensorMode()
    x = _fake_input(mode, shape, layout, x_grad)
    w = mode.from_tensor(torch.randn(16, 8).requires_grad_(w_grad))
    b = mode.from_tensor(torch.randn(16))
    g = mode.from_tensor(torch.randn(8).requires_grad_(w_grad))
    with mode, torch.set_grad_enabled(grad_mode):
        for fn, args, kwargs in ((F.linear, (x, w, b), {}), (F.linear, (x, w), {}),
                                 (F.layer_norm, (x, (8,), g, g), {"eps": 1e-6}),
                                 (F.layer_norm, (x, [8]), {})):
            fast = fast_result(fn, args, kwargs)
            assert fast is not None, (fn, shape, layout)
            assert _meta(fast) == _meta(fn(*args, **kwargs)), (fn.__name__, shape, layout)


def test_linear_and_layer_norm_rules_decline_what_torch_must_report():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(3, 8))
    with mode:
        assert fast_result(F.linear, (x, mode.from_tensor(torch.randn(4, 7))), {}) is None
        assert fast_result(F.linear, (x, mode.from_tensor(torch.randn(4, 8, dtype=torch.float64))),
                           {}) is None
        assert fast_result(F.linear, (x, mode.from_tensor(torch.randn(4, 8)),
                                      mode.from_tensor(torch.randn(5))), {}) is None
        assert fast_result(F.layer_norm, (x, (7,)), {}) is None
        assert fast_result(F.layer_norm, (x, (8,), mode.from_tensor(torch.randn(7))), {}) is None
        assert fast_result(F.layer_norm, (x, (2, 3, 8)), {}) is None
        with torch.autocast("cpu"):
            assert fast_result(F.linear, (x, mode.from_tensor(torch.randn(4, 8))), {}) is None


def test_capture_of_a_convnext_block_with_rules_matches_eager(recorder):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.norm = nn.LayerNorm(8)
            self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            y = self.norm(self.dw(x).permute(0, 2, 3, 1))
            return x + self.down(F.gelu(self.up(y))).permute(0, 3, 1, 2)

    model, x = Block(), torch.randn(2, 8, 5, 5)
    g = kc.optimize(model, recorder, fullgraph=True)
    got, want = g(x), model(x)
    assert_same(got, want)
    got.sum().backward()
    grad = model.up.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    assert_same(grad, model.up.weight.grad, atol=1e-4)


def _full_meta(t):
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad, t.is_leaf)


def _rule_vs_running(fn, args, kwargs):
    try:
        slow = fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - torch refuses: the rule must decline
        assert fast_result(fn, args, kwargs) is None
        return None
    fast = fast_result(fn, args, kwargs)
    if fast is not None:
        assert _full_meta(fast) == _full_meta(slow), (fn, [getattr(a, "shape", a) for a in args], kwargs)
    return fast


def test_addmm_rule_matches_running_it():
    mode = FakeTensorMode()
    taken = 0
    for n, k, m in [(1, 3, 4), (5, 3, 1), (2, 1, 3), (4, 6, 5), (1, 1, 1)]:
        for grad in (False, True):
            mats = [torch.randn(n, k, requires_grad=grad), torch.randn(k, n).t()[:, :k] if k <= n else
                    torch.randn(n, k), torch.randn(n, k, dtype=torch.float64)]
            rights = [torch.randn(k, m), torch.randn(m, k).t(), torch.randn(k + 1, m)]
            biases = [torch.randn(m), torch.randn(n, m), torch.randn(1, m), torch.randn(n, 1), torch.randn(()),
                      torch.randn(m + 1), torch.randn(2, n, m), torch.randn(m, dtype=torch.bfloat16)]
            for a, b, c in [(x, y, z) for x in biases for y in mats for z in rights]:
                fa, fb, fc = (mode.from_tensor(t) for t in (a, b, c))
                for kwargs in ({}, {"beta": 0.5}, {"alpha": 2, "beta": 1}, {"out": None}):
                    with mode:
                        taken += _rule_vs_running(torch.addmm, (fa, fb, fc), kwargs) is not None
    assert taken > 100


def test_embedding_rule_matches_running_it():
    mode = FakeTensorMode()
    taken = 0
    weights = [torch.randn(10, 4), torch.randn(10, 4, requires_grad=True), torch.randn(4, 10).t(),
               torch.randn(10, 4, dtype=torch.bfloat16), torch.randn(10)]
    indices = [torch.randint(0, 10, (2, 3)), torch.randint(0, 10, (5,)), torch.tensor(3),
               torch.randint(0, 10, (3, 2)).t(), torch.randint(0, 10, (2, 3), dtype=torch.int32),
               torch.randn(2, 3)]
    for w, i in [(w, i) for w in weights for i in indices]:
        fw, fi = mode.from_tensor(w), mode.from_tensor(i)
        for args, kwargs in [((fi, fw), {}), ((fi, fw, 0), {}), ((fi, fw), {"padding_idx": -1}),
                             ((fi, fw), {"padding_idx": 10}), ((fi, fw), {"max_norm": 1.0}),
                             ((fi, fw), {"sparse": True}), ((fi, fw), {"scale_grad_by_freq": True})]:
            for grad in (True, False):
                with mode, torch.set_grad_enabled(grad):
                    taken += _rule_vs_running(F.embedding, args, kwargs) is not None
    assert taken > 40


def _fake_on(mode, t, device):
    """A fake tensor with ``t``'s layout on ``device`` (a CUDA fake tensor needs no GPU)."""
    with mode:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_conv2d_rule_matches_running_it(device):
    mode = FakeTensorMode()
    taken = 0
    inputs = [torch.randn(2, 4, 7, 7), torch.randn(1, 4, 5, 6), torch.randn(2, 4, 1, 1), torch.randn(2, 4, 3, 3),
              torch.randn(2, 4, 7, 7).to(memory_format=torch.channels_last), torch.randn(2, 4, 7, 7)[:, :, ::2],
              torch.randn(4, 7, 7), torch.randn(2, 4, 6, 6, dtype=torch.float64), torch.randn(2, 1, 5, 5)]
    weights = [torch.randn(6, 4, 3, 3), torch.randn(8, 4, 1, 1), torch.randn(4, 1, 3, 3), torch.randn(6, 2, 3, 3),
               torch.randn(6, 4, 3, 3).to(memory_format=torch.channels_last), torch.randn(3, 4, 5, 5),
               torch.randn(6, 4, 3, 3, requires_grad=True), torch.randn(6, 1, 1, 1)]
    options = [{}, {"stride": 2, "padding": 1}, {"padding": (1, 2), "dilation": 2}, {"groups": 4, "padding": 1},
               {"groups": 2}, {"stride": (2, 1)}, {"padding": "same"}, {"stride": 0}, {"padding": -1}]
    for x, w in [(x, w) for x in inputs for w in weights]:
        fx_, fw = _fake_on(mode, x, device), _fake_on(mode, w, device)
        for bias in (None, _fake_on(mode, torch.randn(w.shape[0]), device), _fake_on(mode, torch.randn(2), device)):
            for kw in options:
                for grad in (True, False):
                    with mode, torch.set_grad_enabled(grad):
                        taken += _rule_vs_running(F.conv2d, (fx_, fw, bias), kw) is not None
    assert taken > 100


def test_conv_rule_keeps_a_dynamic_batch_range():
    """A symbolic batch through conv2d's shape rule stays over its whole range (no guard against the
    other sizes of the output)."""
    conv = nn.Conv2d(3, 16, 3, stride=2, padding=1).eval()

    def f(x):
        return conv(x)

    x = torch.randn(3, 3, 8, 8)
    kc.mark_dynamic(x, 0, min=2, max=64)
    with torch.no_grad():
        cap = kc.capture_graph(f, (x,))
    assert not [g for g in cap.guards if g.kind == "SHAPE_EXPR" and g.note != "size range"]
    ranges = sorted(g.expected.split(" ", 1)[1] for g in cap.guards if g.kind == "SHAPE_EXPR")
    assert ranges == ["<= 64", ">= 2"]
