"""Convolution bias added by the consumer's generated kernel (graph_passes/conv_bias.py).

On CPU tensors the rewrite runs with ``conv_bias_devices=("cpu",)`` and the Triton backend (the
interpreter: run with TRITON_INTERPRET=1 where there is no GPU); fake CUDA tensors show what a GPU
compile generates. Each compiled program is called with fresh inputs and compared with eager; the
structural checks read the schedule: the convolution extern gets no bias, and the program has no
more kernels than without the rewrite. GPU tests (``-m gpu``) count ATen ``add_`` calls in the profiler.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import trace

import kiln
from kiln.graph import CompiledGraph
from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.graph_passes.conv_bias import split_conv_bias

aten = torch.ops.aten
needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
SPLIT = InductorOptions(strict_lowering=True, cpu_backend="triton", conv_bias_devices=("cpu",))
KEEP = SPLIT.replace(conv_bias_devices=())


def block_ln(x, w, b, g, beta):  # ConvNeXt: depthwise 7x7, channels-last LayerNorm
    y = F.conv2d(x, w, b, padding=3, groups=x.shape[1]).permute(0, 2, 3, 1)
    return F.layer_norm(y, (y.shape[-1],), g, beta, 1e-6)


def residual(x, w, b):
    return torch.relu(F.conv2d(x, w, b, padding=1) + x)


def transposed(x, w, b):  # groups=2: the bias is over the 2 * 3 output channels
    return torch.relu(F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2))


def depthwise_gelu(x, w, b):
    return F.gelu(F.conv2d(x, w, b, stride=2, padding=1, groups=x.shape[1]))


def conv1d_silu(x, w, b):
    return F.silu(F.conv1d(x, w, b, padding=2))


def conv3d_relu(x, w, b):
    return torch.relu(F.conv3d(x, w, b, padding=1))


def alone(x, w, b):
    return F.conv2d(x, w, b, padding=1)


def feeds_a_convolution(x, w, b):  # the biased output is another convolution's operand: it is stored
    y = F.conv2d(x, w, b, padding=1)
    return F.conv2d(y, w, None, padding=1) + y


def saved(x, w, b):  # a training forward: the biased output is saved for the backward, and read by the gelu
    y = F.conv2d(x, w, b, padding=1)
    return y, F.gelu(y)


def _args(case: str, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)
    if case == "block_ln":
        x = r(2, 16, 9, 9).contiguous(memory_format=torch.channels_last)
        return [x, r(16, 1, 7, 7), r(16), r(16), r(16)]
    return {"residual": lambda: [r(2, 8, 6, 6), r(8, 8, 3, 3), r(8)],
            "transposed": lambda: [r(2, 4, 5, 5), r(4, 3, 3, 3), r(6)],
            "depthwise_gelu": lambda: [r(2, 8, 9, 9), r(8, 1, 3, 3), r(8)],
            "conv1d_silu": lambda: [r(2, 4, 17), r(6, 4, 5), r(6)],
            "conv3d_relu": lambda: [r(2, 3, 4, 5, 6), r(5, 3, 3, 3, 3), r(5)],
            "saved": lambda: [r(2, 8, 6, 6), r(8, 8, 3, 3), r(8)],
            "alone": lambda: [r(2, 4, 6, 6), r(8, 4, 3, 3), r(8)],
            "feeds_a_convolution": lambda: [r(2, 8, 6, 6), r(8, 8, 3, 3), r(8)]}[case]()


CASES: dict[str, Callable[..., torch.Tensor]] = {f.__name__: f for f in (
    block_ln, residual, transposed, depthwise_gelu, conv1d_silu, conv3d_relu, saved, alone,
    feeds_a_convolution)}
SPLITS = {"alone": False, "feeds_a_convolution": False}  # the others are rewritten


def _convolutions(cg: CompiledGraph) -> list[Any]:
    return [s.work for s in cg.scheduled.steps  # type: ignore[attr-defined]
            if getattr(s.work, "target", None) == "aten.convolution.default"]


def _has_bias(ext: Any) -> bool:
    return not (hasattr(ext.args[2], "value") and ext.args[2].value is None)


def _n_kernels(cg: CompiledGraph) -> int:
    return len(cg.scheduled.kernels())  # type: ignore[attr-defined]


def _compile(case: str, options: InductorOptions, dtype: torch.dtype = torch.float32) -> CompiledGraph:
    args = _args(case, torch.Generator().manual_seed(0), dtype)
    return compile_graph(trace(CASES[case], *args), args, options=options)


def test_the_rewrite_on_the_graph() -> None:
    """Rewritten: conv(x, w, None) + b.view(C, 1, 1); the same values; a stored output keeps its bias."""
    args = _args("residual", torch.Generator().manual_seed(0))
    gm = trace(residual, *args)
    want = gm(*args)
    assert split_conv_bias(gm, devices=("cpu",)) == 1
    conv = next(n for n in gm.graph.nodes if n.target is aten.convolution.default)
    assert conv.args[2] is None and [u.target for u in conv.users] == [aten.add.Tensor]
    torch.testing.assert_close(gm(*args), want)
    for case in ("alone", "feeds_a_convolution"):
        args = _args(case, torch.Generator().manual_seed(0))
        assert split_conv_bias(trace(CASES[case], *args), devices=("cpu",)) == 0, case
    assert split_conv_bias(trace(residual, *args[:3]), devices=("cuda",)) == 0  # CPU tensors: not asked for


@needs_triton
@pytest.mark.parametrize("case", list(CASES))
def test_bias_add_fused_and_matches_eager(case: str) -> None:
    cg, kept = _compile(case, SPLIT), _compile(case, KEEP)
    split = SPLITS.get(case, True)
    assert [_has_bias(e) for e in _convolutions(cg)][:1] == [not split]
    assert _has_bias(_convolutions(kept)[0])
    # the add lives in a kernel the program runs anyway: no kernel more than with the bias in the extern
    assert _n_kernels(cg) == _n_kernels(kept), (_n_kernels(cg), _n_kernels(kept))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):  # fresh inputs each call
        args = _args(case, gen)
        got, want = cg.fn(*args), CASES[case](*args)
        torch.testing.assert_close(got, want if isinstance(want, tuple) else (want,), rtol=1e-4, atol=1e-4)


@needs_triton
def test_bfloat16_block_rounds_the_sum_as_eager() -> None:
    """bf16: eager rounds conv + bias to bf16 before the LayerNorm; the fused kernel does too."""
    cg = _compile("block_ln", SPLIT, torch.bfloat16)
    assert not any(_has_bias(e) for e in _convolutions(cg))
    kernels = cg.texts["output_code"].split("# ---- kernels ----")[1]
    assert "_kiln_round_bf16" in kernels
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):
        args = _args("block_ln", gen, torch.bfloat16)
        (got,) = cg.fn(*args)
        torch.testing.assert_close(got, block_ln(*args), rtol=2e-2, atol=2e-2)


def test_cuda_program_calls_the_convolution_without_bias() -> None:
    """The CUDA path (fake CUDA tensors, default options): a ConvNeXt block's depthwise convolution has
    no bias, its add is in the LayerNorm kernel, and the program has one kernel."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(8, 96, 14, 14, dtype=torch.bfloat16, device="cuda").contiguous(
            memory_format=torch.channels_last)
        args = [x, *(torch.empty(*s, dtype=torch.bfloat16, device="cuda") for s in ((96, 1, 7, 7), (96,), (96,), (96,)))]
        cg = compile_graph(trace(block_ln, *args), args, options=InductorOptions(strict_lowering=True))
    (conv,) = _convolutions(cg)
    assert not _has_bias(conv) and _n_kernels(cg) == 1


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.pw = torch.nn.Conv2d(4, 6, 1)
        self.ln = torch.nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.dw(x)) + x
        y = F.gelu(self.up(y))
        return self.ln(self.pw(y).permute(0, 2, 3, 1)).square().mean()


@needs_triton
def test_training_bias_gradients_match_eager() -> None:
    torch.manual_seed(0)
    model = _Net()
    compiled = kiln.compile(model, options={"cpu_backend": "triton", "conv_bias_devices": ("cpu",)})
    for _ in range(3):  # fresh inputs each step
        x = torch.randn(2, 8, 5, 5, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        loss = compiled(x)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        want = model(x_ref)
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)
        model.zero_grad()


# ---- GPU: no ATen bias add after cuDNN's convolutions ----

def _aten_adds(fn: Callable[[], Any]) -> int:
    """ATen add_ calls (cuDNN's convolution adds its bias with one) made by ``fn``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::add_")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("wrapper", ["python", "cpp"])
@pytest.mark.parametrize("case", ["block_ln", "residual", "transposed", "depthwise_gelu", "conv3d_relu"])
def test_gpu_no_separate_bias_kernel(case: str, wrapper: str) -> None:
    opts = InductorOptions(strict_lowering=True, wrapper=wrapper)
    gen = torch.Generator().manual_seed(0)
    args = [a.cuda() for a in _args(case, gen, torch.bfloat16)]
    cg = compile_graph(trace(CASES[case], *args), args, options=opts)
    assert not any(_has_bias(e) for e in _convolutions(cg))
    for _ in range(3):
        args = [a.cuda() for a in _args(case, gen, torch.bfloat16)]  # .cuda() keeps channels-last
        with torch.no_grad():
            want = CASES[case](*args)
        (got,) = cg.fn(*args)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        assert _aten_adds(lambda a=args: cg.fn(*a)) == 0
        torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_convnext_block_module_matches_eager() -> None:
    """kiln.compile of a ConvNeXt-style module in bf16 inference: eager's values, and ATen add_ calls only for
    the three downsampling convolutions, which feed the next convolution (an extern, no kernel to fuse into)
    and keep their bias: the H200 counted 3 (21 stride-1 blocks' biases fused)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False).cuda().to(torch.bfloat16).eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 64, 64, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x), model(x), rtol=5e-2, atol=5e-2)
        assert _aten_adds(lambda: compiled(x)) <= 3


# cubins come from triton's compiler: in a process without TRITON_INTERPRET (conftest may have set it)
CPP_PROGRAM = """
import sys
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
sys.path.insert(0, {tests!r})
from tracer import trace
from graph_passes.test_conv_bias import block_ln
from kiln.inductor import InductorOptions
from kiln.inductor.cpp_graph import build_cpp_graph
with FakeTensorMode(allow_non_fake_inputs=True):
    x = torch.empty(8, 96, 14, 14, dtype=torch.bfloat16, device="cuda").contiguous(memory_format=torch.channels_last)
    args = [x, *(torch.empty(*s, dtype=torch.bfloat16, device="cuda") for s in ((96, 1, 7, 7), (96,), (96,), (96,)))]
    built = build_cpp_graph(trace(block_ln, *args), args, options=InductorOptions(wrapper="cpp"), cuda_arch=90)
print(len(built.program.cubins))
print(built.program.wrapper_source)
"""


@pytest.mark.slow
def test_cpp_wrapper_calls_the_convolution_without_bias() -> None:
    """kiln.package / wrapper="cpp" on CUDA (built here for sm_90 from fake tensors): libtorch's convolution
    gets an undefined bias, and the one cubin, the LayerNorm, reads the bias (input 2)."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = CPP_PROGRAM.format(tests=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    n_cubins, source = r.stdout.split("\n", 1)
    assert n_cubins == "1"
    assert "kiln_rt::convolution(arg0, arg1, kiln_rt::Tensor(), {1, 1}, {3, 3}, {1, 1}, false, {0, 0}, 96)" in source
    (launch,) = [line for line in source.splitlines() if "launch(" in line and "k1_native_layer_norm" in line]
    assert "arg2" in launch, launch
