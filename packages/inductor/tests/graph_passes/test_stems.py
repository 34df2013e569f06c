"""Image stems (graph_passes/stems.py): a patch embedding rewritten as a matmul equals the convolution, in both
input layouts, with and without bias; other convolutions are left alone; on the CUDA path
(cross-compiled with fake tensors) the program calls a matmul and no convolution. A channels-last
half-precision stem with its channels zero-padded to 8 equals the convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.graph_passes.stems import pad_stem_channels, rewrite_patch_convs

aten = torch.ops.aten


def _stem(x, w, b):
    return (F.conv2d(x, w, b, stride=w.shape[2:]),)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("k", [(4, 4), (16, 16), (2, 3)])
def test_rewritten_graph_equals_the_convolution(bias: bool, channels_last: bool, k: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 48, 48, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8, 3, *k, generator=g), torch.randn(8, generator=g) if bias else None
    gm = trace(lambda x, w, b=None: _stem(x, w, b), x, w, *([b] if bias else []))
    assert rewrite_patch_convs(gm, devices=("cpu",)) == 1
    assert not any(n.target is aten.convolution.default for n in gm.graph.nodes)
    got = gm(x, w, *([b] if bias else []))[0]
    torch.testing.assert_close(got, F.conv2d(x, w, b, stride=k), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["padded", "overlapping", "wide_input", "not_divisible", "cpu"])
def test_other_convolutions_are_left_alone(case: str) -> None:
    x, w = torch.randn(1, 3, 32, 32), torch.randn(8, 3, 4, 4)
    kw: dict = {"stride": 4}
    if case == "padded":
        kw["padding"] = 1
    elif case == "overlapping":
        kw["stride"] = 2
    elif case == "wide_input":
        x, w = torch.randn(1, 16, 32, 32), torch.randn(8, 16, 4, 4)
    elif case == "not_divisible":
        x = torch.randn(1, 3, 30, 30)
    gm = trace(lambda x, w: (F.conv2d(x, w, **kw),), x, w)
    assert rewrite_patch_convs(gm, devices=("cuda",) if case == "cpu" else ("cpu",)) == 0


def test_cuda_program_runs_a_matmul_for_a_vit_stem() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(2, 3, 64, 64, device="cuda"), torch.empty(32, 3, 16, 16, device="cuda"),
                torch.empty(32, device="cuda")]
        gm = trace(lambda x, w, b: (F.conv2d(x, w, b, stride=16).flatten(2).transpose(1, 2),), *args)
        cg = compile_graph(gm, args, options=InductorOptions(strict_lowering=True))
    src = cg.texts["output_code"]
    assert "torch.addmm" in src or "aten.addmm" in src, src
    assert "convolution" not in src.split("# ---- kernels ----")[0]


@pytest.mark.parametrize("channels_last", [True, False])
def test_padded_stem_equals_the_convolution(channels_last: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 20, 20, generator=g).to(torch.bfloat16)
    w = torch.randn(8, 3, 7, 7, generator=g).to(torch.bfloat16)
    if channels_last:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    gm = trace(lambda x, w: (F.conv2d(x, w, stride=2, padding=3),), x, w)
    assert pad_stem_channels(gm, devices=("cpu",)) == int(channels_last)
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    assert len(pads) == 2 * int(channels_last)
    got = gm(x, w)[0]
    want = F.conv2d(x.float(), w.float(), stride=2, padding=3)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def test_cuda_channels_last_stem_reaches_cudnn_with_8_channels() -> None:
    from kiln.inductor.ir import ExternKernel
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(2, 3, 32, 32, device="cuda", dtype=torch.bfloat16),
                torch.empty(16, 3, 7, 7, device="cuda", dtype=torch.bfloat16)]
        with torch.backends.cudnn.flags(enabled=False):
            gm = trace(lambda x, w: (torch.relu(F.conv2d(x, w, stride=2, padding=3)),), *args)
        cg = compile_graph(gm, args, options=InductorOptions(strict_lowering=True, conv_layout="channels_last"))
    convs = [st.work for st in cg.scheduled.steps  # type: ignore[attr-defined]
             if isinstance(st.work, ExternKernel) and st.work.target == "aten.convolution.default"]
    assert len(convs) == 1
    assert [int(a.shape[1]) for a in convs[0].args[:2]] == [8, 8], convs[0].as_text()
