"""Channels-last convolution graphs (graph_passes/conv_layout.py): results and strides vs eager, no transposes between
convolutions, loops in memory order, training (forward + backward graphs), and the auto heuristics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F
from dynamic_helpers import symbolic_fakes_graph, symbolic_graph
from helpers import STRICT, assert_close, compile_fn
from test_models import _functional
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import flat_outputs, trace

from kiln.graph import GraphAnnotations, annotate
from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.decomp_bridge import ensure_meta
from kiln.inductor.graph_passes.conv_layout import decide
from kiln.inductor.ir import ExternKernel, Kernel, index_vars, is_static, reads
from kiln.runtime import GuardError

CL = STRICT.replace(conv_layout="channels_last")
KEEP = STRICT.replace(conv_layout="keep")


def _is_cl(shape: Sequence[Any], stride: Sequence[Any]) -> bool:
    return torch.empty_strided([int(s) for s in shape], [int(s) for s in stride]).is_contiguous(
        memory_format=torch.channels_last) and len(shape) == 4


def run_both(fn: Any, *args: Any, atol: float = 1e-4, rtol: float = 1e-4, options: InductorOptions = CL):
    """Compile with ``options``, compare values and strides of every output with eager."""
    cg = compile_fn(fn, *args, options=options)
    got = cg.fn(*args)
    with torch.no_grad():
        want = flat_outputs(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, atol, rtol)
        assert g.stride() == w.stride(), (g.stride(), w.stride())
    return cg


def _convs(cg: Any) -> list[ExternKernel]:
    return [s.work for s in cg.scheduled.steps
            if isinstance(s.work, ExternKernel) and s.work.target == "aten.convolution.default"]


class BasicBlock(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + x)


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 -> 3x3 (strided) -> 1x1, projection shortcut, max-pool stem in front."""

    def __init__(self, cin: int = 8, mid: int = 8, cout: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cin, 7, 2, 3, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.a = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(mid, mid, 3, 2, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))
        self.fc = nn.Linear(cout, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = F.relu(self.c(self.b(self.a(x))) + self.down(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise 3x3, squeeze-excite, project 1x1."""

    def __init__(self, c: int = 8, e: int = 24) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.se1, self.se2 = nn.Conv2d(e, 8, 1), nn.Conv2d(8, e, 1)
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.expand(x))
        s = F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        return x + self.project(y * s)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.fc2(F.gelu(self.fc1(self.ln(y))))
        return x + y.permute(0, 3, 1, 2)


def _model_check(model: nn.Module, x: torch.Tensor, **kw: Any) -> Any:
    torch.manual_seed(0)
    f, ps = _functional(model.eval())
    return run_both(f, x, *ps, **kw)


def test_basic_block_matches_eager_and_keeps_output_strides() -> None:
    torch.manual_seed(0)
    _model_check(BasicBlock(), torch.randn(2, 16, 8, 8))


def test_no_transpose_between_convs_joined_by_bn_relu() -> None:
    """conv -> BN -> ReLU -> conv: one fused kernel between the two convolutions, reading the first
    conv's channels-last output and writing the second's channels-last input in one contiguous loop."""
    torch.manual_seed(0)
    cg = _model_check(BasicBlock(), torch.randn(2, 16, 8, 8))
    steps = [s.work for s in cg.scheduled.steps]
    convs = _convs(cg)
    assert len(convs) == 2
    for c in convs:
        x, w = c.args[0], c.args[1]
        assert _is_cl(x.shape, x.stride) and _is_cl(w.shape, w.stride), c.as_text()
        assert _is_cl(c.outputs[0].layout.shape, c.outputs[0].layout.stride)
    between = steps[steps.index(convs[0]) + 1: steps.index(convs[1])]
    assert len(between) == 1 and isinstance(between[0], Kernel), [s.as_text() for s in between]
    k = between[0]
    assert convs[0].outputs[0].buffer in k.inputs and convs[1].args[0].buffer in k.outputs
    assert _row_major_store(k), k.as_text()  # loops walk NHWC memory in order: no strided stores
    # the same graph kept NCHW has the same kernel count: the layout adds no kernel between convs
    keep = compile_fn(*_fx_args(BasicBlock(), torch.randn(2, 16, 8, 8)), options=KEEP)
    keep_steps = [s.work for s in keep.scheduled.steps]
    kc = _convs(keep)
    assert len(keep_steps[keep_steps.index(kc[0]) + 1: keep_steps.index(kc[1])]) == 1


def _row_major_store(k: Kernel) -> bool:
    """Every store of ``k`` is at the row-major position of its loop point (innermost loop: stride 1)."""
    xs = index_vars("x", len(k.outer))
    flat, step = sympy.Integer(0), sympy.Integer(1)
    for x, size in reversed(list(zip(xs, k.outer))):
        flat, step = flat + x * step, step * size
    return all(sympy.expand(n.store_index - flat) == 0 for n in k.nodes if n.store)


def _fx_args(model: nn.Module, x: torch.Tensor) -> tuple:
    f, ps = _functional(model.eval())
    return (f, x, *ps)


def test_bottleneck_with_stem_pool_and_classifier() -> None:
    torch.manual_seed(0)
    cg = _model_check(Bottleneck(), torch.randn(2, 3, 32, 32))
    # every buffer a convolution reads or writes is channels-last
    for c in _convs(cg):
        assert _is_cl(c.args[0].shape, c.args[0].stride)
        assert _is_cl(c.outputs[0].layout.shape, c.outputs[0].layout.stride)


def test_inverted_residual_depthwise_and_squeeze_excite() -> None:
    torch.manual_seed(0)
    cg = _model_check(InvertedResidual(), torch.randn(2, 8, 10, 10))
    assert any(c.args[-1].value == 24 for c in _convs(cg))  # the depthwise conv (groups) ran


def test_convnext_block_permute_layernorm_permute() -> None:
    torch.manual_seed(0)
    cg = _model_check(ConvNeXtBlock(), torch.randn(2, 16, 8, 8))
    # after the permute the NHWC activation is contiguous: LayerNorm's rows are unit-stride loads
    conv_out = _convs(cg)[0].outputs[0].buffer
    rows = [k for k in cg.scheduled.kernels() if k.inner and conv_out in k.inputs]
    assert rows, cg.texts["ir_post_fusion"]
    r0 = index_vars("r", 1)[0]
    for k in rows:
        for n in k.nodes:
            for ld in reads(n.body):
                if ld.buffer == conv_out:
                    assert sympy.expand(ld.index).coeff(r0) == 1, k.as_text()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stride,padding,dilation,groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 3, 1, 2), (1, 1, 1, 4)])
def test_conv_arguments(bias: bool, stride: int, padding: int, dilation: int, groups: int) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, stride, padding, dilation, groups, bias=bias)

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, ps[0], ps[1] if bias else None, stride, padding, dilation, groups)
        return torch.sigmoid(y) * 2.0

    ps = [conv.weight.detach()] + ([conv.bias.detach()] if bias else [])
    run_both(f, torch.randn(2, 8, 9, 11), *ps)


def test_channels_last_input_keeps_channels_last_output() -> None:
    """A caller feeding channels-last gets channels-last back (eager's strides), with no copy."""
    torch.manual_seed(0)
    w = torch.randn(8, 4, 3, 3)
    x = torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last)
    cg = run_both(lambda x, w: (F.relu(F.conv2d(x, w, padding=1)),), x, w)
    assert cg.fn(x, w)[0].is_contiguous(memory_format=torch.channels_last)


def test_outputs_that_are_not_channels_last_in_eager() -> None:
    """Mixed outputs: a conv result, a flatten of it, a transposed view and a BN statistic."""
    torch.manual_seed(0)

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple:
        y = F.conv2d(x, w, padding=1)
        return y, y.flatten(1) * 2, (y + 1).transpose(2, 3), y.mean((0, 2, 3))

    run_both(f, torch.randn(2, 4, 5, 6), torch.randn(6, 4, 3, 3))


def test_keep_changes_nothing() -> None:
    torch.manual_seed(0)
    cg = _model_check(BasicBlock(), torch.randn(2, 16, 8, 8), options=KEEP)
    for c in _convs(cg):
        assert not _is_cl(c.args[0].shape, c.args[0].stride)


def test_bf16_block() -> None:
    torch.manual_seed(0)
    model = BasicBlock().to(torch.bfloat16)
    _model_check(model, torch.randn(2, 16, 8, 8, dtype=torch.bfloat16), atol=3e-2, rtol=3e-2)


# ---- training: forward and backward graphs --------------------------------------------------------

def _aot_compile(model: nn.Module, x: torch.Tensor, options: InductorOptions, seen: dict) -> Any:
    """kiln.autograd + kiln.inductor as the meta-package composes them, with the backward's inputs
    checked against the strides its graph was compiled for (saved activations cross graphs)."""
    aot_mod = pytest.importorskip("kiln.autograd")
    from kiln.inductor import inductor_decompositions

    def fw(gm: Any, ex: Sequence[Any]) -> Any:
        cg = compile_graph(gm, ex, options=options)
        seen.setdefault("texts", []).append(cg.texts)
        return cg

    def bw(gm: Any, ex: Sequence[Any]) -> Any:
        want = [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in ex]
        cg = compile_graph(gm, ex, options=options)
        seen.setdefault("texts", []).append(cg.texts)

        def run(*args: Any) -> Any:
            for k, (a, s) in enumerate(zip(args, want)):
                if isinstance(a, torch.Tensor) and s is not None and a.numel() > 1:
                    assert a.stride() == s, f"backward input {k}: stride {a.stride()} but compiled for {s}"
            seen["bw_calls"] = seen.get("bw_calls", 0) + 1
            return cg.fn(*args)
        return run

    f, ps = _functional(model)
    gm = _call_graph(f, 1 + len(ps))
    return aot_mod.aot(gm, [x.requires_grad_(True), *ps], fw_compiler=fw, bw_compiler=bw,
                       decompositions=inductor_decompositions()), ps


def _call_graph(f: Any, n: int) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    ins = [g.placeholder(f"a{k}") for k in range(n)]
    out = g.call_function(f, tuple(ins))
    g.output((out,))
    return torch.fx.GraphModule(nn.Module(), g)


@pytest.mark.parametrize("options", [CL, STRICT], ids=["channels_last", "auto"])
@pytest.mark.parametrize("model,shape", [(BasicBlock(8), (2, 8, 6, 6)), (InvertedResidual(), (2, 8, 6, 6)),
                                         (ConvNeXtBlock(8), (2, 8, 6, 6))])
def test_training_gradients_match_eager(model: nn.Module, shape: tuple, options: InductorOptions) -> None:
    """Forced channels-last, and "auto" (which turns CPU training graphs channels-last)."""
    torch.manual_seed(0)
    model = model.train()
    x = torch.randn(*shape)
    ref_model = model
    seen: dict = {}
    compiled, ps = _aot_compile(model, x.clone(), options, seen)
    params = [p.detach().clone().requires_grad_(p.requires_grad) for p in ps]
    xc = x.clone().requires_grad_(True)
    out = compiled.fn(xc, *params)[0]
    g = torch.randn_like(out)
    out.backward(g)
    xe = x.clone().requires_grad_(True)
    f, ps_e = _functional(ref_model)
    ps_e = [p.detach().clone().requires_grad_(p.requires_grad) for p in ps_e]
    want = f(xe, *ps_e)
    want.backward(g)
    assert_close(out, want.detach(), 1e-4, 1e-4)
    assert out.stride() == want.stride()
    assert_close(xc.grad, xe.grad, 1e-4, 1e-4)
    assert xc.grad.stride() == xe.grad.stride()
    for a, b in zip(params, ps_e):
        if b.grad is not None:
            assert_close(a.grad, b.grad, 2e-4, 2e-4)
    assert seen.get("bw_calls") == 1
    texts = seen["texts"]
    assert len(texts) == 2 and all("convolution" in t["output_code"] for t in texts)


# ---- the auto heuristics ---------------------------------------------------------------------------

def _fake_graph(device: str, cin: int, cout: int, groups: int = 1, k: int = 3) -> tuple:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.empty(2, cin, 16, 16, device=device)
        w = torch.empty(cout, cin // groups, k, k, device=device)
    gm = trace_fake(x, w, groups)
    return gm, [x, w]


def trace_fake(x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    a, b = g.placeholder("x"), g.placeholder("w")
    a.meta["val"], b.meta["val"] = x, w
    c = g.call_function(torch.ops.aten.convolution.default, (a, b, None, [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                            groups))
    with x.fake_mode:
        c.meta["val"] = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    g.output((c,))
    return torch.fx.GraphModule(nn.Module(), g)


def test_auto_is_off_on_cpu_and_on_for_cuda_convs() -> None:
    gm, ex = _fake_graph("cpu", 128, 128)
    assert not decide(gm, ex, "auto", training_channels_last=True).channels_last
    assert decide(gm, ex, "channels_last").channels_last
    assert not decide(gm, ex, "keep").channels_last
    try:
        gm, ex = _fake_graph("cuda", 128, 128)
    except Exception as e:  # a CPU-only torch build cannot make fake CUDA tensors
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    # the graph returns its conv's activation: copying it back to NCHW is as big as the conv's input
    d = decide(gm, ex, "auto")
    assert not d.channels_last and "copied back" in d.reason
    for groups, want in ((1, True), (2, False), (128, True)):  # grouped (64 channels a group): off
        gm, ex = _fake_graph("cuda", 128, 128, groups=groups)
        annotate(gm, GraphAnnotations(layout_free_outputs=(0,)))  # a later graph takes it in any layout (a saved activation)
        # the training rules themselves (off by default)
        assert decide(gm, ex, "auto", training_channels_last=True).channels_last is want, groups


def test_auto_turns_cpu_training_graphs_channels_last() -> None:
    """On CPU, inference graphs keep NCHW and training graphs go channels-last (oneDNN's convolution
    backward is NHWC): a forward whose saved outputs are marked layout-free, and a backward. A forward
    that returns its image and weights (saved for the backward) reads them only in its convolution:
    passing a placeholder to the output is no NCHW read."""
    gm, ex = _fake_graph("cpu", 16, 16)
    x, w = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    detached = gm.graph.call_function(torch.ops.aten.detach.default, (w,))
    detached.meta["val"] = w.meta["val"]
    out.args = ((*out.args[0], x, detached),)
    d = decide(gm, ex, "auto")
    assert not d.channels_last and "inference" in d.reason, d.reason
    annotate(gm, GraphAnnotations(layout_free_outputs=(0, 1, 2)))
    d = decide(gm, ex, "auto")
    assert d.channels_last and "CPU training" in d.reason, d.reason
    # a pointwise read of the NCHW image would mix layouts: that graph keeps NCHW
    relu = gm.graph.call_function(torch.ops.aten.relu.default, (x,))
    relu.meta["val"] = x.meta["val"]
    out.args = ((*out.args[0], relu),)
    annotate(gm, GraphAnnotations(layout_free_outputs=(0, 1, 2, 3)))
    d = decide(gm, ex, "auto")
    assert not d.channels_last and "NCHW activation inputs" in d.reason, d.reason


@pytest.mark.parametrize("cin,groups,k,want", [(16, 1, 3, True), (128, 1, 3, False), (128, 1, 1, True),
                                               (128, 128, 3, True), (128, 8, 3, True)])
def test_auto_cpu_training_keeps_nchw_for_dense_wide_convolutions(cin: int, groups: int, k: int, want: bool) -> None:
    """oneDNN's NCHW training convolutions are faster for dense spatial convolutions over many channels
    (ResNet-18's 0.81x channels-last); narrow, 1x1, depthwise and grouped ones go channels-last."""
    gm, ex = _fake_graph("cpu", cin, cin, groups=groups, k=k)
    annotate(gm, GraphAnnotations(layout_free_outputs=(0,)))
    d = decide(gm, ex, "auto")
    assert d.channels_last is want, d.reason
    if not want:
        assert "dense spatial convolutions" in d.reason, d.reason


def test_auto_skips_graphs_mixing_nchw_inputs_into_nhwc_work() -> None:
    """A graph whose NCHW activation input meets the conv output in pointwise work (a backward fed
    NCHW saved activations) stays as traced; the same input channels-last goes channels-last."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for memory_format, want in ((torch.contiguous_format, False), (torch.channels_last, True)):
        try:
            with mode:
                x, w = torch.empty(2, 128, 16, 16, device="cuda"), torch.empty(128, 128, 3, 3, device="cuda")
                y = torch.empty(2, 128, 16, 16, device="cuda").to(memory_format=memory_format)
        except Exception as e:
            pytest.skip(f"fake CUDA tensors unavailable: {e}")
        g = torch.fx.Graph()
        ph = [g.placeholder(n) for n in ("x", "w", "y")]
        for p, v in zip(ph, (x, w, y)):
            p.meta["val"] = v
        c = g.call_function(torch.ops.aten.convolution.default,
                            (ph[0], ph[1], None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        a = g.call_function(torch.ops.aten.mul.Tensor, (c, ph[2]))
        s = g.call_function(torch.ops.aten.sum.default, (a,))
        with mode:
            c.meta["val"] = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
            a.meta["val"] = c.meta["val"] * y
            s.meta["val"] = a.meta["val"].sum()
        g.output((s,))
        d = decide(torch.fx.GraphModule(nn.Module(), g), [x, w, y], "auto")
        assert d.channels_last is want, d.reason


def test_auto_training_backward_graph() -> None:
    """convolution_backward's arguments sit elsewhere than convolution's (transposed at 7, groups at 9);
    by default training graphs keep NCHW (measured slower channels-last on the H200)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            go, x, w = (torch.empty(2, 128, 16, 16, device="cuda"), torch.empty(2, 128, 16, 16, device="cuda"),
                        torch.empty(128, 128, 3, 3, device="cuda"))
            res = torch.ops.aten.convolution_backward.default(go, x, w, [128], [1, 1], [1, 1], [1, 1], False,
                                                              [0, 0], 1, [True, True, False])
    except Exception as e:
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    g = torch.fx.Graph()
    ph = [g.placeholder(n) for n in ("go", "x", "w")]
    for p, v in zip(ph, (go, x, w)):
        p.meta["val"] = v
    c = g.call_function(torch.ops.aten.convolution_backward.default,
                        (*ph, [128], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]))
    c.meta["val"] = res
    g.output((c,))
    gm = torch.fx.GraphModule(nn.Module(), g)
    d = decide(gm, [go, x, w], "auto")
    assert not d.channels_last and "training" in d.reason, d.reason
    d = decide(gm, [go, x, w], "auto", training_channels_last=True)
    assert d.channels_last, d.reason


def test_auto_keeps_nchw_when_a_spatial_reduction_feeds_later_convolutions() -> None:
    """Squeeze-excite (mean over H, W, then more convolutions) stays NCHW; a final global pool does not
    count (nothing convolves after it)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            x, w = torch.empty(2, 128, 16, 16, device="cuda"), torch.empty(128, 128, 3, 3, device="cuda")
    except Exception as e:
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    aten = torch.ops.aten
    conv_args = (None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    for se in (True, False):
        g = torch.fx.Graph()
        a, b = g.placeholder("x"), g.placeholder("w")
        a.meta["val"], b.meta["val"] = x, w
        with mode:
            c1v = aten.convolution.default(x, w, *conv_args)
            pv = aten.mean.dim(c1v, [2, 3], True)
            sv = aten.mul.Tensor(c1v, pv)
            c2v = aten.convolution.default(sv, w, *conv_args)
        c1 = g.call_function(aten.convolution.default, (a, b, *conv_args))
        c1.meta["val"] = c1v
        if se:
            p = g.call_function(aten.mean.dim, (c1, [2, 3], True))
            p.meta["val"] = pv
            s2 = g.call_function(aten.mul.Tensor, (c1, p))
            s2.meta["val"] = sv
            c2 = g.call_function(aten.convolution.default, (s2, b, *conv_args))
            c2.meta["val"] = c2v
            out = g.call_function(aten.sum.default, (c2,))
        else:
            c2 = g.call_function(aten.convolution.default, (c1, b, *conv_args))
            c2.meta["val"] = c2v
            p = g.call_function(aten.mean.dim, (c2, [2, 3], True))
            p.meta["val"] = pv
            out = g.call_function(aten.sum.default, (p,))
        with mode:
            out.meta["val"] = torch.empty((), device="cuda")
        g.output((out,))
        d = decide(torch.fx.GraphModule(nn.Module(), g), [x, w], "auto")
        assert d.channels_last is not se, d.reason
        if se:
            assert "squeeze-excite" in d.reason


def test_unknown_mode_is_an_error() -> None:
    gm, ex = _fake_graph("cpu", 8, 8)
    with pytest.raises(ValueError, match="conv_layout"):
        decide(gm, ex, "nhwc")


def test_graph_without_convolutions_is_untouched() -> None:
    x = torch.randn(4, 8)
    gm = trace(lambda x: (x.relu() + 1,), x)
    before = gm.code
    cg = compile_graph(gm, [x], options=CL)
    assert gm.code == before
    assert_close(cg.fn(x)[0], x.relu() + 1)


def test_saved_activations_may_stay_channels_last() -> None:
    """The forward marks its saved outputs layout-free (what kiln.autograd can do through
    ``GraphAnnotations.layout_free_outputs``), the backward is compiled for the strides the forward
    really returns (``CompiledGraph.output_strides``): no NCHW round trip for saved activations,
    and gradients still match eager."""
    ag = pytest.importorskip("kiln.autograd")
    from kiln.inductor import inductor_decompositions

    torch.manual_seed(0)
    model = BasicBlock(8).train()
    f, ps = _functional(model)
    x = torch.randn(2, 8, 6, 6)
    params = [p.detach().clone().requires_grad_(p.is_floating_point() and p.requires_grad) for p in ps]
    xr = x.clone().requires_grad_(True)
    joint = ag.trace_joint(_call_graph(f, 1 + len(ps)), [xr, *params], decompositions=inductor_decompositions())
    parts = ag.partition(joint)
    sig = joint.signature
    fw_out = next(n for n in parts.fw_gm.graph.nodes if n.op == "output").args[0]
    n_out = len(fw_out)
    saved_pos = tuple(range(n_out - parts.n_saved, n_out))
    annotate(parts.fw_gm, GraphAnnotations(layout_free_outputs=saved_pos))
    fw_ex = [n.meta["val"] for n in parts.fw_gm.graph.nodes if n.op == "placeholder"]
    fw = compile_graph(parts.fw_gm, fw_ex, options=CL)
    bw_ph = [n for n in parts.bw_gm.graph.nodes if n.op == "placeholder"]
    changed = 0
    for j, pos in enumerate(saved_pos):
        v, st = bw_ph[j].meta["val"], fw.output_strides[pos]
        if isinstance(v, torch.Tensor) and st is not None and tuple(v.stride()) != st:
            with v.fake_mode:
                bw_ph[j].meta["val"] = torch.empty_strided(v.shape, st, dtype=v.dtype, device=v.device)
            changed += 1
    assert changed >= 2  # conv inputs/outputs saved channels-last
    bw = compile_graph(parts.bw_gm, [n.meta["val"] for n in bw_ph], options=CL)
    # no backward kernel converts a saved activation: every convolution_backward operand it reads
    # is a saved input or a kernel's NHWC output, and no kernel reads a saved input to write NHWC
    outs = fw.fn(x.clone(), *[p.detach().clone() for p in ps])
    saved = list(outs[n_out - parts.n_saved:])
    y = outs[0]
    g = torch.randn_like(y)
    grads = bw.fn(*saved, g)
    xe = x.clone().requires_grad_(True)
    pe = [p.detach().clone().requires_grad_(p.is_floating_point() and p.requires_grad) for p in ps]
    want = f(xe, *pe)
    want.backward(g)
    assert_close(y, want.detach(), 1e-4, 1e-4)
    assert y.stride() == want.stride()  # the user-visible output still has eager's strides
    leaves = [xe, *pe]
    assert len(grads) == len(sig.grad_inputs)
    for idx, gr in zip(sig.grad_inputs, grads):
        assert_close(gr, leaves[idx].grad, 2e-4, 2e-4)
        assert gr.stride() == leaves[idx].grad.stride()


def test_env_knob_sets_the_default() -> None:
    from kiln.inductor.knobs import read_knobs

    assert read_knobs({"KILN_CONV_LAYOUT": "keep"}).conv_layout == "keep"
    assert read_knobs({}).conv_layout == "auto"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_on_cuda_block(dtype: torch.dtype) -> None:
    """On a GPU, ``auto`` turns a conv block channels-last (cuDNN NHWC, Triton kernels in between) and
    results and strides still match eager."""
    torch.manual_seed(0)
    model = Bottleneck().eval().to("cuda", dtype)
    f, ps = _functional(model)
    x = torch.randn(4, 3, 32, 32, device="cuda", dtype=dtype)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
    cg = run_both(f, x, *ps, options=STRICT, atol=tol, rtol=tol)
    assert all(c.args[0].stride[1] == 1 for c in _convs(cg))


def test_transposed_1d_and_3d_convolutions() -> None:
    """Transposed 2-D convs go channels-last too (forced); 1-D and 3-D convs are left as traced."""
    torch.manual_seed(0)

    def f(x, w, x1, w1, x3, w3):
        return (F.relu(F.conv_transpose2d(x, w, stride=2, padding=1)) * 2, F.conv1d(x1, w1).sigmoid(),
                F.conv3d(x3, w3).tanh())

    args = (torch.randn(2, 4, 5, 5), torch.randn(4, 6, 3, 3), torch.randn(2, 3, 9), torch.randn(5, 3, 3),
            torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2))
    cg = run_both(f, *args)
    ranks = {len(c.args[0].shape): c.args[0].stride[1] == 1 for c in _convs(cg)}
    assert ranks == {4: True, 3: False, 5: False}


def test_channels_last_rewrite_values_match_a_full_repropagation(monkeypatch) -> None:
    """The conversion's later re-propagations reuse the values of nodes whose inputs did not change;
    every node ends with the metadata a from-scratch re-propagation gives."""
    from kiln.inductor.graph_passes import conv_layout as L

    torch.manual_seed(0)
    m = Bottleneck().eval()
    x = torch.randn(2, 3, 32, 32)
    fn, tensors = _functional(m)
    examples = [x, *[t.detach() for t in tensors]]
    gm = trace(fn, *examples)

    ensure_meta(gm, examples)
    ran: list[int] = []
    real_run = L._run
    monkeypatch.setattr(L, "_run", lambda n, env: ran.append(1) or real_run(n, env))
    assert L.to_channels_last(gm, examples) > 0
    calls = len(ran)

    def meta(n):
        v = n.meta.get("val")
        return (tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else None
    incremental = [meta(n) for n in gm.graph.nodes]
    ran.clear()
    L.repropagate(gm, examples)
    assert [meta(n) for n in gm.graph.nodes] == incremental
    n_call = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    assert n_call <= calls < 2 * n_call  # the second pass re-ran only what the conversions changed


# ---- symbolic sizes: a ResNet-style graph traced with a symbolic batch and image size (dynamic=True) runs
# its convolutions on NHWC operands like the static graph, with no size assumed ----

def _symbolic_model(model: nn.Module, x: torch.Tensor):
    torch.manual_seed(0)
    f, ps = _functional(model.eval())
    with torch.no_grad():
        gm, examples = symbolic_graph(f, x, *ps, dynamic={0: (0, 2, 3)})
    return f, ps, gm, examples


@pytest.mark.parametrize("model,channels", [(Bottleneck, 3), (BasicBlock, 16)], ids=["bottleneck", "basic_block"])
def test_symbolic_conv_graph_runs_channels_last_for_every_size(model, channels) -> None:
    f, ps, gm, examples = _symbolic_model(model(), torch.randn(2, channels, 24, 24))
    cg = compile_graph(gm, examples, options=CL)
    assert cg.backend == "inductor", cg.texts.get("fallbacks")
    convs = _convs(cg)
    assert convs and all(c.args[0].stride[1] == 1 for c in convs), [c.args[0].stride for c in convs]
    assert any(not is_static(s) for c in convs for s in c.args[0].stride)  # NHWC strides of symbolic sizes
    steps = [s.work for s in cg.scheduled.steps]
    between = [k for k in steps[steps.index(convs[0]) + 1: steps.index(convs[1])] if isinstance(k, Kernel)]
    # loops walk NHWC memory in order, the strides ranked at the example sizes (not NCHW order: strided stores)
    assert between and all(_row_major_store(k) for k in between), [k.as_text() for k in between]
    # torch's stride rules (its dtype conversions' density check) assume each downsampled image side is
    # not 1: guards the wrapper checks, and a degenerate image is refused, never computed wrongly
    guards = cg.loop_program.size_guards  # type: ignore[attr-defined]
    assert all(g.reason == "a compile step assumed this relation" for g in guards), guards
    for n, h, w in ((2, 24, 24), (1, 17, 9), (3, 32, 20), (5, 9, 40)):
        x = torch.randn(n, channels, h, w)
        got = cg.fn(x, *ps)
        with torch.no_grad():
            want = f(x, *ps)
        torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4, msg=lambda m, size=(n, h, w): f"{size}: {m}")
        assert got[0].stride() == want.stride(), ((n, h, w), got[0].stride(), want.stride())
    if guards:
        with pytest.raises(GuardError):
            cg.fn(torch.randn(1, channels, 1, 1), *ps)


def test_auto_turns_symbolic_cuda_convolutions_channels_last() -> None:
    """``auto`` decides from the example sizes (hints) for a graph over a symbolic batch and image size
    on CUDA (fake CUDA tensors on this host), as it does for the static graph: ResNet-50 under
    ``dynamic=True`` ran NCHW convolutions wrapped in cuDNN's transposes (0.54 of its static speed)."""
    model = Bottleneck(cin=64, mid=64, cout=256).eval()

    def f(x, *ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (x,))
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    shapes = [(32, 3, 224, 224)] + [tuple(t.shape) for t in (*model.parameters(), *model.buffers())]
    try:
        with torch.no_grad():
            gm, examples, env = symbolic_fakes_graph(f, shapes, {0: (0, 2, 3)}, "cuda", torch.float32)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    ensure_meta(gm, examples)
    guards = len(env.guards)
    decision = decide(gm, examples, "auto")
    assert decision.channels_last, decision.reason
    assert len(env.guards) == guards  # decided from hints, no size compared
    cg = compile_graph(gm, examples, options=STRICT)  # Triton kernels between cuDNN's NHWC convolutions
    convs = _convs(cg)
    assert convs and all(c.args[0].stride[1] == 1 for c in convs), [c.args[0].stride for c in convs]
