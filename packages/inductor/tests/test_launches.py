"""Launches a compiled step makes: no pure copy kernels, no kernel torch.compile would not launch.

The CUDA programs are compiled here for fake CUDA tensors (no GPU needed) and counted in the generated
wrapper; numerics are checked against eager on CPU, on the C++ path and the Triton interpreter.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, check
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.ir import Cast, Load

aten = torch.ops.aten
STRICT = InductorOptions(strict_lowering=True)
TRITON = InductorOptions(strict_lowering=True, cpu_backend="triton")


def wrapper_launches(cg) -> list[str]:
    """What the generated wrapper's ``call`` launches, in order: Triton kernel names and the ATen ops of
    extern calls (``_mm_padded`` counted as itself)."""
    body = cg.texts["output_code"].split("def call_owned(args):", 1)[1].split("# ---- kernels ----")[0]
    out = []
    for line in body.splitlines():
        m = re.search(r"\b_launch_(\w+)\(", line)
        if m:
            out.append(m.group(1))
        elif "# extern" in line or "# fallback" in line or "_mm_padded(" in line:
            out.append("extern " + (line.rsplit("# extern", 1)[-1].strip() if "# extern" in line else "call"))
    return out


def copy_kernels(cg) -> list[str]:
    """Launched kernels whose every stored value is a load of one buffer (a layout change: a
    ``.contiguous()``, a materialised transpose, a clone), possibly converted."""
    kernels = {k.name: k for k in cg.scheduled.kernels()}
    out = []
    for name in wrapper_launches(cg):
        k = kernels.get(name)
        if k is None:
            continue
        stored = [n.body for n in k.nodes if n.store]
        if stored and all(isinstance(b, Load) and not b.indirect
                          or isinstance(b, Cast) and isinstance(b.x, Load) and not b.x.indirect for b in stored):
            out.append(name)
    return out


def _fake_cuda(*shapes_dtypes):
    return [torch.empty(s, dtype=d, device="cuda") for s, d in shapes_dtypes]


def gpt2_block(x, mask, ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_fc, b_fc, w_proj, b_proj):
    """One GPT-2 block as kiln.autograd traces it for an H200 (HF Conv1D weights, efficient attention
    with the additive form of the boolean mask, as kiln/autograd/attention.py calls it)."""
    b, t, c = x.shape
    heads = 4
    h = F.layer_norm(x, (c,), ln1_w, ln1_b)
    qkv = torch.addmm(b_qkv, h.view(-1, c), w_qkv).view(b, t, 3 * c)
    q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in qkv.split(c, 2))
    bias = aten.masked_fill.Scalar(torch.zeros(mask.shape, dtype=x.dtype, device=x.device), ~mask, float("-inf"))
    a = aten._scaled_dot_product_efficient_attention(q, k, v, bias.expand(b, heads, t, t), False)[0]
    x = x + torch.addmm(b_o, a.transpose(1, 2).reshape(-1, c), w_o).view(b, t, c)
    h = F.layer_norm(x, (c,), ln2_w, ln2_b)
    f = F.gelu(torch.addmm(b_fc, h.view(-1, c), w_fc), approximate="tanh")
    return (x + torch.addmm(b_proj, f, w_proj).view(b, t, c),)


def test_gpt2_block_inference_on_cuda_has_no_pure_copy_kernel() -> None:
    """Each LayerNorm is one kernel with the normalised values it writes for the next matmul (it was a
    statistics kernel plus a second kernel over [B*L, C] reading the row again); the attention mask
    and its additive form are one kernel. 5 Triton kernels (LayerNorm, mask, residual + LayerNorm,
    GELU, residual) + 5 library calls (was 7 + 5)."""
    bf16 = torch.bfloat16
    with FakeTensorMode(allow_non_fake_inputs=True):
        c = 64
        args = _fake_cuda(((2, 32, c), bf16), ((2, 1, 32, 32), torch.bool), ((c,), bf16), ((c,), bf16),
                          ((c, 3 * c), bf16), ((3 * c,), bf16), ((c, c), bf16), ((c,), bf16), ((c,), bf16),
                          ((c,), bf16), ((c, 4 * c), bf16), ((4 * c,), bf16), ((4 * c, c), bf16), ((c,), bf16))
        cg = compile_graph(trace(gpt2_block, *args), args, options=STRICT)
    launches = wrapper_launches(cg)
    kernels = [x for x in launches if not x.startswith("extern")]
    externs = [x for x in launches if x.startswith("extern")]
    assert copy_kernels(cg) == [], launches
    assert len(externs) == 5, launches
    assert len(kernels) == 5, launches


def _ln_linear(x, r, w, b, lw, lb):
    h = x + r
    return F.linear(F.layer_norm(h, h.shape[-1:], lw, lb), w, b), h


@pytest.mark.parametrize("options", [STRICT, TRITON], ids=["cpp", "triton"])
def test_layer_norm_feeding_a_matmul_is_one_kernel(options: InductorOptions) -> None:
    if options.cpu_backend == "triton":
        pytest.importorskip("triton")
        import os
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("needs TRITON_INTERPRET=1")
    torch.manual_seed(0)
    args = (torch.randn(2, 7, 16), torch.randn(2, 7, 16), torch.randn(24, 16), torch.randn(24),
            torch.randn(16), torch.randn(16))
    cg = check(_ln_linear, *args, atol=1e-4, options=options)
    # the residual add, the statistics and the normalised [2, 7, 16] values for the [14, 16] matmul
    assert len(cg.scheduled.kernels()) == 1, cg.texts["ir_post_fusion"]


def test_reshaped_operands_that_are_not_views_of_their_source_still_match_eager() -> None:
    """A reshape of a transposed lazy value (no strides express it over the source's contiguous
    layout) is stored as before; a reshape of a reshape folds down to the first source."""
    torch.manual_seed(0)

    def f(x, w):
        t = torch.sigmoid(x).transpose(1, 2).reshape(-1, 5)  # [2, 6, 5] -> [12, 5]: not a view
        u = (x * 2).reshape(2, 30).reshape(10, 6)  # view of a view of [2, 5, 6]
        return t @ w, u @ w.t()
    check(f, torch.randn(2, 5, 6), torch.randn(5, 6), atol=1e-4)


def test_mask_and_its_additive_form_are_one_kernel_on_cuda() -> None:
    """The boolean mask is stored (GPT-2's: a large body read by every layer; here: also returned); the
    layers' additive form of it (the same, computed once) joins the mask's kernel: one kernel, not two."""
    def f(pos, q, k, v):
        mask = (pos[:, None, :, None] >= pos[:, None, None, :])  # [B, 1, T, T], a size-1 head dim
        out = q
        for _ in range(2):  # two layers, one mask
            bias = aten.masked_fill.Scalar(torch.zeros(mask.shape, dtype=q.dtype, device=q.device), ~mask,
                                           float("-inf"))
            out = aten._scaled_dot_product_efficient_attention(out, k, v, bias.expand(2, 4, 16, 16), False)[0]
        return out, mask
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _fake_cuda(((2, 16), torch.int64), *[((2, 4, 16, 8), torch.bfloat16)] * 3)
        cg = compile_graph(trace(f, *args), args, options=STRICT)
    launches = wrapper_launches(cg)
    assert len(launches) == 3, launches  # the mask kernel and two attention calls


def test_mm_padded_with_bias_matches_addmm() -> None:
    from kiln.inductor.graph_passes.pad_matmuls import mm_padded_blocks

    torch.manual_seed(0)
    a, w, bias = torch.randn(200, 16), torch.randn(37, 16), torch.randn(37)
    got = mm_padded_blocks(bias, a, w.t(), 200, 8)
    assert_close(got, torch.addmm(bias, a, w.t()))
    assert got.is_contiguous()


def test_autocast_layer_norm_feeding_a_matmul_is_one_kernel() -> None:
    """Under autocast the matmul reads ``view(ln).to(bf16)``: the cast of a reshape is the reshape of
    the cast, stored in the LayerNorm's own iteration space (GPT-2 training: 25 kernels less a step)."""
    torch.manual_seed(0)

    def f(x, w, b, lw, lb):
        y = F.layer_norm(x, (16,), lw, lb)
        return torch.addmm(b.bfloat16(), y.view(-1, 16).bfloat16(), w.bfloat16()), y.sum()
    args = (torch.randn(2, 8, 16), torch.randn(16, 24), torch.randn(24), torch.randn(16), torch.randn(16))
    cg = check(f, *args, atol=1e-4)
    row_kernels = [k for k in cg.scheduled.kernels() if k.inner]
    ln = next(k for k in row_kernels if "native_layer_norm" in k.name)
    assert any(n.dtype == torch.bfloat16 and n.store for n in ln.nodes), cg.texts["ir_post_fusion"]
    assert len(cg.scheduled.kernels()) == 4, cg.texts["ir_post_fusion"]  # LN+cast, bias, weight, sum


def _decode_layer(x, w_qkv, w_o, cos, pos, mask, k_cache, v_cache):
    """One layer of a bs=1 decode step as kiln.autograd traces it for an H200: q/k/v projection, the new
    key (rotated) and value written into the caches at ``pos``, one-query efficient attention over them."""
    heads, d = 4, x.shape[-1] // 4
    q, k, v = torch.mm(x, w_qkv).view(1, 3, heads, d).unbind(1)
    k_new = k_cache.index_put((pos,), k * cos)
    v_new = v_cache.index_put((pos,), v)
    bias = torch.where(mask, 0.0, float("-inf")).to(x.dtype).expand(1, heads, 1, mask.shape[-1])
    a = aten._scaled_dot_product_efficient_attention((q * cos).unsqueeze(0).transpose(1, 2),
                                                      k_new.unsqueeze(0).transpose(1, 2),
                                                      v_new.unsqueeze(0).transpose(1, 2), bias, False)[0]
    return torch.mm(a.transpose(1, 2).reshape(1, heads * d), w_o), k_new, v_new


def test_decode_layer_on_cuda_writes_both_caches_and_the_query_in_one_launch() -> None:
    """The key-cache write, the value-cache write and the query's rotation are one kernel group (three
    launches before, codegen/triton/group.py); the one-query attention is kiln's Triton kernel, not the
    library's (decode_attention.py); the one-row projections are generated reductions (gemv_as_reduction):
    4 launches, none a library call (6 before: three writes and the mask's additive form, the attention)."""
    from kiln.graph import GraphAnnotations, annotate

    bf16 = torch.bfloat16
    with FakeTensorMode(allow_non_fake_inputs=True):
        c, s = 64, 128
        args = _fake_cuda(((1, c), bf16), ((c, 3 * c), bf16), ((c, c), bf16), ((c // 4,), torch.float32),
                          ((1,), torch.int64), ((1, 1, 1, s), torch.bool), ((s, 4, c // 4), bf16),
                          ((s, 4, c // 4), bf16))
        gm = trace(_decode_layer, *args)
        annotate(gm, GraphAnnotations(input_mutations=((1, 6), (2, 7))))
        cg = compile_graph(gm, args, options=InductorOptions(strict_lowering=True, decode_attention=True))
    launches = wrapper_launches(cg)
    assert not [x for x in launches if x.startswith("extern")], launches
    assert sum(x.startswith("group") for x in launches) == 1 and sum(x.startswith("attn_") for x in launches) == 1
    assert len(launches) == 4, launches


@pytest.mark.parametrize("kwargs", [{"scale": 0.3}, {"dropout_p": 0.0, "is_causal": True, "scale": 0.3}])
def test_decode_attention_reads_the_cuda_ops_keyword_arguments(kwargs) -> None:
    """ATen's CUDA attention ops take ``scale`` by keyword only (and dropout/is_causal either way): the
    template read positions only, so a CUDA call's scale was dropped (found by the GPU test: results off
    by 0.4); a causal call by keyword keeps the library kernel."""
    bf16 = torch.bfloat16

    def f(q, k, v, bias):
        return (aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, **kwargs)[0],)

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _fake_cuda(((1, 4, 1, 32), bf16), ((1, 4, 64, 32), bf16), ((1, 4, 64, 32), bf16), ((1, 4, 1, 64), bf16))
        cg = compile_graph(trace(f, *args), args, options=InductorOptions(strict_lowering=True, decode_attention=True))
    code = cg.texts["output_code"]
    if kwargs.get("is_causal"):
        assert "_launch_attn_" not in code and "_scaled_dot_product_efficient_attention" in code
    else:
        assert "_launch_attn_" in code and "* 0.3" in code, code
