"""kiln.inductor's Triton compile workers start when a CUDA graph must be compiled (a graph-cache miss,
before the joint trace), not at ``kiln.compile``: a warm start that compiles nothing spawns none."""

from __future__ import annotations

import pytest
import torch


def test_cpu_work_does_not_start_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    import kiln.inductor
    monkeypatch.setattr(kiln.inductor, "warm_compile_pool", lambda device="cuda": calls.append(device))
    kiln.compile(torch.nn.Linear(8, 8))
    f = kiln.compile(lambda x: x * 2)
    f(torch.randn(3))
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pool_starts_on_a_cache_miss_not_at_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    import kiln.inductor
    monkeypatch.setattr(kiln.inductor, "warm_compile_pool", lambda device="cuda": calls.append(device))
    width = int(torch.randint(9, 4096, ()))  # a size no earlier run left in the graph cache: a miss
    model = torch.nn.Linear(8, width).cuda()
    compiled = kiln.compile(model)  # no call yet: nothing captured, nothing to compile
    assert calls == []
    x = torch.randn(4, 8, device="cuda")
    torch.testing.assert_close(compiled(x), model(x))
    assert calls and calls[0] == "cuda"
