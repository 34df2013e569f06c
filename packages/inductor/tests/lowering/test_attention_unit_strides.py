"""CUDA attention externs get q/k/v views whose dims of size 1 carry an aligned stride. The kernels
check every stride's alignment, also that of a dim of size 1, which addresses nothing: HF GPT-2's
decode step (a (B, H, 1, D) query) under symbolic sizes was traced with stride 1 on its length dim and
failed on the H200 with "query is not correctly aligned (strideM)". Lowered here for fake CUDA tensors
(``python -m benchmarks.generate --device cuda --models gpt2`` is the GPU check)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode  # tests only: fake CUDA without a GPU

from kiln.inductor import InductorOptions
from kiln.inductor.ir import ExternKernel, TensorRef
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


def test_efficient_attention_extern_gets_aligned_query_strides():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            q = torch.empty_strided((2, 12, 1, 64), (2304, 64, 1, 1), device="cuda")
            k = torch.empty(2, 12, 9, 64, device="cuda")
            v = torch.empty(2, 12, 9, 64, device="cuda")
            out = torch.ops.aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    g = fx.Graph()
    nodes = [g.placeholder(n) for n in "qkv"]
    for n, val in zip(nodes, (q, k, v)):
        n.meta["val"] = val
    att = g.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                          (*nodes, None, False))
    att.meta["val"] = out
    first = g.call_function(operator.getitem, (att, 0))
    first.meta["val"] = out[0]
    g.output((first,))
    program, _ = lower_graph(fx.GraphModule({}, g), [q, k, v], InductorOptions())
    externs = [n for n in program.nodes if isinstance(n, ExternKernel)]
    assert externs, program.as_text()
    query = externs[0].args[0]
    assert isinstance(query, TensorRef) and tuple(query.stride) == (2304, 64, 64, 1), query
