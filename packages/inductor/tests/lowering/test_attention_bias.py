"""The attention kernels' additive bias is stored with rows on 16-element boundaries (torch's pad_bias
layout): a 197-wide BEiT bias stored densely made the efficient-attention kernel refuse it on the GPU."""

from __future__ import annotations

import re

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from kiln.inductor import compile_graph

aten = torch.ops.aten


def _graph() -> fx.GraphModule:
    g = fx.Graph()
    q, k, v, b = (g.placeholder(n) for n in ("q", "k", "v", "b"))
    bias = g.call_function(aten.mul.Tensor, (b, 2.0))  # computed in the graph: kiln stores it
    att = g.call_function(aten._scaled_dot_product_efficient_attention.default, (q, k, v, bias, False))
    g.output((g.call_function(__import__("operator").getitem, (att, 0)),))
    return fx.GraphModule(torch.nn.Module(), g)


def test_efficient_attention_bias_rows_are_16_aligned() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        qkv = [torch.empty(1, 2, 197, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
        bias = torch.empty(1, 2, 197, 197, dtype=torch.bfloat16, device="cuda")
        cg = compile_graph(_graph(), [*qkv, bias])  # cross-compiled: sources only, nothing runs
    source = cg.portable.source
    # stored in rows of 208 (the padding included), passed to the kernel as its 197-wide view
    allocs = re.findall(r"(buf\d+) = torch\.empty_strided\(\(1, 2, 197, 208\), \(([0-9, ]+)\)", source)
    assert allocs, source
    name, text = allocs[0]
    strides = [int(s) for s in text.split(",")]
    assert strides == [81952, 40976, 208, 1], strides  # 197 -> 208 per row
    assert f"{name}.as_strided((1, 2, 197, 197), (81952, 40976, 208, 1))" in source, source
    # the padding is written, with zeros (as torch's pad_bias writes it), not left with what a recycled
    # block held
    kernel = re.search(rf"def (k\d+)\w*\(ptr_\w+, ptr_{name}\b.*?(?=\n\n)", source, re.S)
    assert kernel, source
    body = kernel.group(0)
    assert "xnumel = 81952" in body and "< tl.full([], 197, tl.int64)" in body and "0.0" in body, body


def test_broadcast_bias_stays_broadcast_with_aligned_rows() -> None:
    g = fx.Graph()
    q, k, v, b = (g.placeholder(n) for n in ("q", "k", "v", "b"))
    bias = g.call_function(aten.expand.default, (g.call_function(aten.mul.Tensor, (b, 2.0)), [2, 4, 197, 197]))
    att = g.call_function(aten._scaled_dot_product_efficient_attention.default, (q, k, v, bias, False))
    g.output((g.call_function(__import__("operator").getitem, (att, 0)),))
    with FakeTensorMode(allow_non_fake_inputs=True):
        qkv = [torch.empty(2, 4, 197, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
        one = torch.empty(2, 1, 197, 197, dtype=torch.bfloat16, device="cuda")  # one bias for all heads
        cg = compile_graph(fx.GraphModule(torch.nn.Module(), g), [*qkv, one])
    source = cg.portable.source
    allocs = re.findall(r"empty_strided\(\(2, 1, 197, 208\), \(([0-9, ]+)\)", source)
    assert allocs, source  # stored once, not once per head
    strides = [int(s) for s in allocs[0].split(",")]
    assert strides[-1] == 1 and all(s % 16 == 0 for s in strides[:-1]), strides
