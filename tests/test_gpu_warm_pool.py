"""kiln.compile starts kiln.inductor's Triton compile workers before capture for CUDA work (GPU only)."""

from __future__ import annotations

import pytest
import torch

import kiln

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _pool_started() -> bool:
    from kiln.inductor.codegen.triton import compile_pool as cp
    return bool(cp._POOL)


def test_module_with_cuda_parameters_starts_the_pool_at_compile() -> None:
    model = torch.nn.Linear(8, 8).cuda()
    compiled = kiln.compile(model)  # no call yet: nothing captured
    assert _pool_started()
    x = torch.randn(4, 8, device="cuda")
    torch.testing.assert_close(compiled(x), model(x))


def test_cpu_work_does_not_start_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    import kiln.inductor
    monkeypatch.setattr(kiln.inductor, "warm_compile_pool", lambda device="cuda": calls.append(device))
    kiln.compile(torch.nn.Linear(8, 8))
    f = kiln.compile(lambda x: x * 2)
    f(torch.randn(3))
    assert calls == []
    g = kiln.compile(lambda x: x * 3)
    g(torch.randn(3, device="cuda"))
    assert calls == ["cuda"]
