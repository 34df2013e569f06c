"""The graph cache keys a symbolic graph on its symbolic signature: a later process (here: a second
kiln.compile) capturing the same graph at another size loads it instead of compiling, and serves
every size from it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
import kiln.capture as kc
import kiln.runtime.cache as runtime_cache
from kiln.runtime import CompileCache


@pytest.fixture
def local_cache(tmp_path: Path) -> Iterator[CompileCache]:
    """A compile cache of this test's own, the process's default while the test runs."""
    with runtime_cache.using_cache(CompileCache(tmp_path)) as store:
        yield store


def test_symbolic_graph_hit_at_another_size(local_cache: CompileCache) -> None:
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    before = kiln.stats()
    first = kiln.compile(net, backend="aot_eager", dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 8, requires_grad=True)
        torch.testing.assert_close(first(x), net(x))
    compiled = kiln.stats() - before
    assert (compiled.cache_misses, compiled.cache_hits) == (1, 0)  # one symbolic graph for both sizes
    second = kiln.compile(net, backend="aot_eager", dynamic=True)  # what a restarted process does
    for n in (9, 13, 2, 30):
        x = torch.randn(n, 8, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        out, ref = second(x), net(y)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
    loaded = kiln.stats() - before
    assert (loaded.cache_misses, loaded.cache_hits) == (1, 1), "the symbolic graph was compiled again instead of loaded"
    assert len(kc.cache_entries(second._compiled_forward)) == 1
