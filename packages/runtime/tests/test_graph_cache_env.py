"""Which environment variables enter the graph cache key: those that can change the compiled program,
not those that only say how many processes compile it (a warm start with other worker settings hits)."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from kiln.runtime import graph_key


def _gm() -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, x):
            return (torch.relu(x) * 2,)
    return fx.symbolic_trace(M())


def _key() -> str:
    return graph_key(_gm(), [torch.randn(4, 3)], backend="inductor", options=())


@pytest.mark.parametrize("var", ["KILN_TRITON_COMPILE_WORKERS", "KILN_TRITON_WORKER_TORCH",
                                 "KILN_TRITON_PRECOMPILE"])
def test_compile_worker_settings_do_not_change_the_key(monkeypatch, var: str) -> None:
    before = _key()
    monkeypatch.setenv(var, "0")
    assert _key() == before


@pytest.mark.parametrize("var", ["KILN_SPLIT_REDUCTIONS", "KILN_TRITON_CROSS_TARGET", "TRITON_DEFAULT_FP_FUSION"])
def test_settings_that_change_the_program_change_the_key(monkeypatch, var: str) -> None:
    before = _key()
    monkeypatch.setenv(var, "0")
    assert _key() != before


def test_the_key_follows_the_declarations(monkeypatch) -> None:
    """Derived from kiln.graph.knobs.ENVIRONMENT: every variable declared to change code changes the
    key, no variable declared not to does, and an undeclared KILN_ variable does (to stay sound)."""
    from kiln.graph import ENVIRONMENT

    before = _key()
    for var in ENVIRONMENT.values():
        with monkeypatch.context() as m:
            m.setenv(var.name, "kiln-test-value")
            assert (_key() != before) is var.changes_code, var
    monkeypatch.setenv("KILN_SOMETHING_NEW", "1")
    assert _key() != before
