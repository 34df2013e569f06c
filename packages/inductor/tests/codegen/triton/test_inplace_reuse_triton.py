"""Triton kernels that store one output write it over an input dying in them (scheduler/inplace.py,
plan_inplace_reuse with single_store): the launch takes the same tensor as input and output pointer.
Under the interpreter on CPU here, on the GPU there (conftest.py)."""

from __future__ import annotations

import torch
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device

OPTIONS = InductorOptions(cpu_backend="triton")


def _x(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(device())


def test_sum_of_two_matmuls_is_written_over_the_first() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.mm(x, w) + torch.mm(y, w) * 0.5,)
    args = (_x(64, 32), _x(32, 48), _x(64, 32))
    cg = compile_graph(trace(f, *args), list(args), options=OPTIONS)
    code = cg.texts["output_code"]
    assert "# written in place" in code and " over " in cg.texts["ir_post_fusion"]
    torch.testing.assert_close(cg.fn(*args)[0], f(*args)[0], atol=1e-4, rtol=1e-4)


def test_kernel_with_two_stores_is_not_written_in_place() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.mm(x, w)
        return (t.sin(), t.cos())  # one kernel, two stores: Triton keeps separate buffers
    args = (_x(16, 8), _x(8, 16))
    cg = compile_graph(trace(f, *args), list(args), options=OPTIONS)
    assert " over " not in cg.texts["ir_post_fusion"]
    got = cg.fn(*args)
    torch.testing.assert_close(got[0], f(*args)[0])
    torch.testing.assert_close(got[1], f(*args)[1])
