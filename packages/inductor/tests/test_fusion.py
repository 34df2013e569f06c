"""Fusion: how many kernels a graph becomes, and which buffers never reach memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, check, compile_fn, n_kernels

from kiln.inductor import InductorOptions

X = torch.randn(16, 32, 64)


def _call_body(cg) -> str:
    return cg.texts["output_code"].split("def call(args):")[1].split("# ---- kernels")[0]


def test_pointwise_chain_is_one_kernel() -> None:
    cg = check(lambda x: ((x * 2 + 1).sin().exp() - x).relu(), X)
    assert n_kernels(cg) == 1
    assert "empty_strided" in cg.texts["output_code"]
    # only the output is allocated: intermediates stay in registers
    assert _call_body(cg).count("torch.empty_strided(") == 1


def test_multi_use_intermediate_stays_local() -> None:
    def f(x):
        y = (x * 3 + 2).tanh().exp().sin().cos().sigmoid() * x.sqrt().log1p().abs().exp()
        return y * y + y.sin()
    cg = check(f, X.abs())
    assert n_kernels(cg) == 1
    assert _call_body(cg).count("torch.empty_strided(") == 1


def test_reduction_with_pointwise_epilogue_is_one_kernel() -> None:
    cg = check(lambda x: (x.exp().sum(-1) * 2).sqrt(), X)
    assert n_kernels(cg) == 1


def test_softmax_is_one_kernel() -> None:
    cg = check(lambda x: torch.softmax(x, -1), X)
    assert n_kernels(cg) == 1


def test_decomposed_softmax_is_one_kernel() -> None:
    def f(x):
        m = x.amax(-1, keepdim=True)
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)
    cg = check(f, X)
    assert n_kernels(cg) == 1


def test_layer_norm_gelu_is_one_kernel() -> None:
    w, b = torch.randn(64), torch.randn(64)
    cg = check(lambda x, w, b: F.gelu(F.layer_norm(x, (64,), w, b)), X, w, b)
    assert n_kernels(cg) == 1


def test_horizontal_fusion_of_independent_work() -> None:
    cg = check(lambda x, y: (x.sin(), y.cos() * 2, (x + y).sum(-1)), X, X + 1)
    assert n_kernels(cg) == 1


def test_extern_splits_kernels() -> None:
    w = torch.randn(64, 64)
    cg = check(lambda x, w: ((x.relu() @ w) + 1).tanh(), X, w)
    assert n_kernels(cg) == 2
    assert "aten.mm" in cg.texts["ir_post_fusion"] or "bmm" in cg.texts["ir_post_fusion"] \
        or "matmul" in cg.texts["ir_post_fusion"] or "mm" in cg.texts["ir_post_fusion"]


def test_fusion_off_gives_one_kernel_per_node() -> None:
    cg = check(lambda x: torch.softmax(x, -1), X, options=InductorOptions(fuse=False, strict_lowering=True))
    assert n_kernels(cg) >= 2


def test_kernel_names_say_what_they_fuse() -> None:
    cg = check(lambda x: torch.softmax(x, -1), X)
    (k,) = cg.scheduled.kernels()
    assert "softmax" in k.name


def test_dead_code_is_removed() -> None:
    def f(x):
        _unused = x.exp().sum()
        return x + 1
    cg = check(f, X)
    assert "sum" not in cg.texts["ir_post_fusion"]


def test_memory_planning_frees_and_reuses() -> None:
    w = torch.randn(64, 64) * 0.1

    def f(x, w):
        a = (x.sin() @ w)
        b = (a.cos() @ w)
        c = (b.exp() @ w)
        return c.relu()
    cg = check(f, X, w, rtol=1e-3)
    code = cg.texts["output_code"]
    assert "del " in code


def test_softmax_computes_exp_once_per_element() -> None:
    cg = check(lambda x: torch.softmax(x, -1), X)
    kernel_src = cg.texts["output_code"].split("# ---- kernels")[1].split('extern "C"')[1]
    assert kernel_src.count("std::exp(") == 1  # the second pass reads the row cache


def test_residual_stream_is_stored_not_resummed() -> None:
    # x = x + f(x) over many layers: a lazy residual would be re-summed from every earlier layer's
    # output in each later kernel (ViT's layer 12 read 24 buffers); it is stored once it reads 3
    ws = [torch.randn(64, 64) * 0.1 for _ in range(8)]

    def f(x, *ws):
        for w in ws:
            x = x + F.layer_norm(x, (64,)) @ w
        return x

    cg = check(f, X, *ws)
    kernel_lines = [ln for ln in _call_body(cg).splitlines() if "_k" in ln and "(" in ln and "aten" not in ln]
    assert kernel_lines
    most = max(ln.count("data_ptr") + ln.count("arg") for ln in kernel_lines)
    assert most <= 8, max(kernel_lines, key=len)


def _rotary_attention_prep(inv_freq, positions, q, k):
    """Llama's rotary embedding as transformers computed it (position x inverse frequency as a bmm with an
    inner size of 1), applied to q and k viewed [B, H, S, D] from [B, S, H * D]."""
    b, s, _ = q.shape
    freqs = (inv_freq[None, :, None].float().expand(b, -1, 1) @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(q.dtype)[:, None], emb.sin().to(q.dtype)[:, None]

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)
    q, k = (t.view(b, s, -1, inv_freq.shape[0] * 2).transpose(1, 2) for t in (q, k))
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_rotary_outer_product_bmm_fuses_into_one_pointwise_kernel(backend: str) -> None:
    # the [B, D/2, 1] @ [B, 1, S] bmm is a broadcast multiply: no extern, no transposed read of its result,
    # so q and k are one 1-D kernel (as an extern, each layer's kernel read it transposed as a 2-D tile)
    b, s, h, d = 2, 16, 2, 8
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    positions = torch.arange(s).repeat(b, 1)
    q, k = torch.randn(b, s, h * d), torch.randn(b, s, h * d)
    options = InductorOptions(strict_lowering=True, cpu_backend=backend)
    cg = compile_fn(_rotary_attention_prep, inv_freq, positions, q, k, options=options)
    assert "bmm" not in _call_body(cg)
    # C++: cos and sin are stored once per position (b, 1, s, d), then q and k rotate in one kernel
    # (lowering/lower.py: a transcendental read broadcast over the heads is not recomputed per head)
    assert n_kernels(cg) == (2 if backend == "cpp" else 1)
    if backend == "triton":
        assert "YBLOCK" not in cg.texts["output_code"]
    for _ in range(3):  # fresh inputs each call
        q, k = torch.randn(b, s, h * d), torch.randn(b, s, h * d)
        positions = torch.randint(0, 100, (b, s))
        got = cg.fn(inv_freq, positions, q, k)
        want = _rotary_attention_prep(inv_freq, positions, q, k)
        for g, w in zip(got, want):
            assert_close(g, w, atol=1e-4, rtol=1e-4)
