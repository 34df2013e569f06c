"""Channels-last convolution graphs on the Triton path (interpreter on CPU, CUDA on a GPU machine):
results and output strides vs eager, and the kernel between two convolutions storing NHWC in order."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn as nn
from graph_passes.test_conv_layout import BasicBlock, ConvNeXtBlock, InvertedResidual
from test_models import _functional
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.ir import ExternKernel, index_vars

OPTIONS = InductorOptions(cpu_backend="triton", strict_lowering=True, conv_layout="channels_last")


@pytest.mark.parametrize("model", [BasicBlock(8), InvertedResidual(), ConvNeXtBlock(8)],
                         ids=["basic_block", "inverted_residual", "convnext_block"])
def test_channels_last_blocks_on_triton(model: nn.Module) -> None:
    torch.manual_seed(0)
    f, ps = _functional(model.eval().to(device()))
    x = torch.randn(2, 8, 6, 6, device=device())
    args = [x, *ps]
    cg = compile_graph(trace(f, *args), args, options=OPTIONS)
    got = cg.fn(*args)
    with torch.no_grad():
        want = flat_outputs(f(*args))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        assert g.stride() == w.stride()
    convs = [s.work for s in cg.scheduled.steps if isinstance(s.work, ExternKernel)
             and s.work.target == "aten.convolution.default"]
    assert convs and all(c.args[0].stride[1] == 1 for c in convs)  # every conv input is NHWC
    # kernels that only write channels-last buffers walk them with the channel loop innermost
    layouts = cg.scheduled.program.layouts()
    for k in cg.scheduled.kernels():
        if k.inner or not all(len(layouts[b].shape) == 4 and layouts[b].stride[1] == 1 for b in k.outputs):
            continue
        xs = index_vars("x", len(k.outer))
        for n in k.nodes:
            if n.store:
                assert sympy.expand(n.store_index).coeff(xs[-1]) == 1, k.as_text()
