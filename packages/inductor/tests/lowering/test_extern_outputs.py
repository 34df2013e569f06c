"""Extern kernels whose results mix tensors and plain numbers (cuDNN attention returns max_q/max_k
ints): lowered as one extern call, the numbers passed on as trace-time constants. Built for CUDA with
fake tensors, so it runs without a GPU (sources are generated, nothing launched)."""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.inductor import InductorOptions, compile_graph


def _cudnn_attention_graph() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    g = fx.Graph()
    q, k, v = (g.placeholder(n) for n in "qkv")
    att = g.call_function(torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                          (q, k, v, None, False, 0.0, False, False))
    out = g.call_function(operator.getitem, (att, 0))
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (out, 2.0)),))
    gm = fx.GraphModule({}, g)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        xs = [torch.empty(1, 4, 8, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    FakeTensorProp(gm, mode).propagate(*xs)
    return gm, xs


def test_cudnn_attention_with_int_outputs_is_an_extern_not_a_whole_graph_fallback() -> None:
    gm, xs = _cudnn_attention_graph()
    vals = next(n for n in gm.graph.nodes if "cudnn" in str(n.target)).meta["val"]
    # max_q/max_k: plain ints on newer torch, None on 2.11; either must lower
    assert all(v is None or isinstance(v, (int, torch.Tensor)) for v in vals)
    # fallback_unknown_ops=False: a lowering failure raises instead of running the graph op by op
    compiled = compile_graph(gm, xs, options=InductorOptions(fallback_unknown_ops=False))
    code = compiled.texts["output_code"]
    assert "aten._scaled_dot_product_cudnn_attention.default(" in code and "# extern" in code
    assert "tl.store" in code  # the multiply is a generated Triton kernel
