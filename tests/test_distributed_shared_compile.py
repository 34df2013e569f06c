"""Ranks of one job share compiled graphs: with one cache directory, the first rank to reach a graph
compiles it under the key's lock, the others wait and load its entry (a ``cache`` log line says so)."""

from __future__ import annotations

import logging
import time

import torch

import kiln


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).softmax(-1) * 3 + x.sum()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def shared_rank(rank: int, world: int) -> dict:
    lines = _Lines()
    kiln.set_logs("cache")
    logging.getLogger("kiln.cache").addHandler(lines)
    compiled = kiln.compile(step, backend="inductor")
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    t0 = time.perf_counter()
    got = compiled(x, w)
    first_call = time.perf_counter() - t0
    ok = all(torch.allclose(compiled(x + i, w), step(x + i, w), atol=1e-5) for i in range(3))
    return {"lines": lines.lines, "ok": ok and torch.allclose(got, step(x, w), atol=1e-5), "first_call": first_call}


def test_one_rank_compiles_the_other_loads(run_ranks, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "shared-cache"))  # the spawned ranks inherit it
    results = run_ranks(shared_rank, timeout=420)
    assert all(r["ok"] for r in results)
    lines = [line for r in results for line in r["lines"]]
    compiled = [line for line in lines if "compiled and stored" in line]
    # the other rank either waited on the lock ("compiled by another process while this one
    # waited") or arrived after the entry was stored: a hit either way, never a second compile
    loaded = [line for line in lines if "graph cache hit" in line]
    assert len(compiled) == 1 and len(loaded) == 1, lines
