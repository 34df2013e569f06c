"""CUDA attention externs get q/k/v views whose dims of size 1 carry an aligned stride. The kernels
check every stride's alignment, also that of a dim of size 1, which addresses nothing: HF GPT-2's
decode step (a (B, H, 1, D) query) under symbolic sizes was traced with stride 1 on its length dim and
failed on the H200 with "query is not correctly aligned (strideM)". Lowered here for fake CUDA tensors
(``python -m benchmarks.generate --device cuda --models gpt2`` is the GPU check)."""

from __future__ import annotations

import operator

import pytest
import sympy
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode  # tests only: fake CUDA without a GPU

from kiln.inductor import InductorOptions
from kiln.inductor.ir import ExternKernel, TensorRef
from kiln.inductor.ir.index import FloorDiv
from kiln.inductor.lowering.extern import _aligned_unit_strides
from kiln.inductor.lowering.lower import lower_graph


def test_unit_dims_get_the_contiguous_stride_and_address_the_same_elements():
    ref = TensorRef("buf", (2, 12, 1, 64), (2304, 64, 1, 1), 0, torch.float32)
    got = _aligned_unit_strides(ref)
    assert tuple(got.stride) == (2304, 64, 64, 1)
    base = torch.randn(2 * 2304)
    assert torch.equal(base.as_strided(ref.shape, ref.stride), base.as_strided(got.shape, tuple(got.stride)))
    assert _aligned_unit_strides(TensorRef("b", (2, 12, 3, 64), (2304, 64, 768, 1), 0, torch.float32)).stride \
        == (2304, 64, 768, 1)  # no dim of size 1: unchanged


def test_unit_dims_keep_a_stride_already_aligned():
    # an aligned mask (kiln's aligned_bias: rows padded to 16 elements) keeps its rows' stride on its
    # dims of size 1; the contiguous stride (the key length) made eager pad it again on every call
    # whose length was not a multiple of 8 (Llama-350M generate() on the H200, 2026-12-04)
    s = sympy.Symbol("s0", integer=True, positive=True)
    row = FloorDiv(s + 15, 16) * 16
    mask = TensorRef("m", (2, 1, 1, s), (row, row, row, 1), 0, torch.bool)
    assert _aligned_unit_strides(mask) is mask
    single = TensorRef("m", (1, 1, 1, 9), (16, 16, 16, 1), 0, torch.bool)
    assert _aligned_unit_strides(single) is single
    # an unaligned stride on a dim of size 1 whose contiguous stride is unaligned too takes the
    # stride of the nearest outer dim stepped along
    odd = TensorRef("m", (2, 1, 1, 9), (16, 9, 1, 1), 0, torch.float32)
    got = _aligned_unit_strides(odd)
    assert tuple(got.stride) == (16, 16, 16, 1)
    base = torch.randn(64)
    assert torch.equal(base.as_strided(odd.shape, odd.stride), base.as_strided(got.shape, tuple(got.stride)))


def _efficient(q, k, v):  # type: ignore[no-untyped-def]
    return torch.ops.aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False), True


def _deferred(q, k, v):  # type: ignore[no-untyped-def]
    # kiln_graph::attention: symbolic sizes with a mask, eager's composite picking the kernel per call
    # (GPT-2's generate() after its sizes went symbolic failed so on the H200, 2026-12-04)
    import kiln.graph  # noqa: F401 - registers kiln_graph's ops

    mask = torch.zeros(q.shape[0], 1, 1, k.shape[2], dtype=torch.bool, device=q.device)
    return torch.ops.kiln_graph.attention.default(q, k, v, mask, False, 0.125, False), False


@pytest.mark.parametrize("op", [_efficient, _deferred], ids=["efficient", "kiln_graph_attention"])
def test_attention_extern_gets_aligned_query_strides(op):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            q = torch.empty_strided((2, 12, 1, 64), (2304, 64, 1, 1), device="cuda")
            k = torch.empty(2, 12, 9, 64, device="cuda")
            v = torch.empty(2, 12, 9, 64, device="cuda")
            out, is_tuple = op(q, k, v)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    g = fx.Graph()
    nodes = [g.placeholder(n) for n in "qkv"]
    for n, val in zip(nodes, (q, k, v)):
        n.meta["val"] = val
    if is_tuple:
        att = g.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default, (*nodes, None, False))
        att.meta["val"] = out
        result = g.call_function(operator.getitem, (att, 0))
        result.meta["val"] = out[0]
    else:
        with mode:
            mask_val = torch.zeros(2, 1, 1, 9, dtype=torch.bool, device="cuda")
        mask = g.call_function(torch.ops.aten.zeros.default, ([2, 1, 1, 9],),
                               {"dtype": torch.bool, "device": torch.device("cuda")})
        mask.meta["val"] = mask_val
        result = g.call_function(torch.ops.kiln_graph.attention.default, (*nodes, mask, False, 0.125, False))
        result.meta["val"] = out
    g.output((result,))
    program, _ = lower_graph(fx.GraphModule({}, g), [q, k, v], InductorOptions())
    externs = [n for n in program.nodes if isinstance(n, ExternKernel) and "attention" in n.target]
    assert externs, program.as_text()
    query = externs[0].args[0]
    assert isinstance(query, TensorRef) and tuple(query.stride) == (2304, 64, 64, 1), query
