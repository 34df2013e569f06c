"""max_pool2d's lowering (an unrolled window max) on the Triton path: interpreter on CPU, GPU there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device

OPTIONS = InductorOptions(cpu_backend="triton", strict_lowering=True)


@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 4, 10, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 2, 8, 7), dict(kernel_size=2)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_matches_eager(shape, kw, dtype):
    x = torch.randn(shape)
    x.view(-1)[5] = float("nan")
    x = x.to(dtype).to(device())

    def fn(t):
        return F.max_pool2d(t.relu() * 2, **kw)
    cg = compile_graph(trace(fn, x), [x], options=OPTIONS)
    assert "fallbacks" not in cg.texts and "@triton.jit" in cg.texts["output_code"]
    (got,) = cg.fn(x)
    with torch.no_grad():
        (want,) = flat_outputs(fn(x))
    torch.testing.assert_close(got, want, equal_nan=True, check_stride=False)
