"""Tensor parallelism (``parallelize_module`` with ColwiseParallel/RowwiseParallel on a 2-rank CPU
mesh, gloo) under kiln.compile (inductor) against an eager twin over several steps with fresh inputs.
The parallel layers' hooks run in Python; their forwards (DTensor inputs and parameters) run as
compiled local programs, forward and backward (``distributed`` log); the plain code around them is
compiled; a module outside torch.nn with DTensor parameters runs eagerly, logged once per frame."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import kiln

STEPS = 4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(self.norm(x))) * 0.5
        return self.down(h) + x


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _logs() -> Iterator[list[str]]:
    """The graph_breaks and distributed log lines written inside the block (each scenario its own: the
    scenarios share one rank job)."""
    lines = _Lines()
    kiln.set_logs("graph_breaks", "distributed")
    loggers = [logging.getLogger("kiln.graph_breaks"), logging.getLogger("kiln.distributed")]
    for logger in loggers:
        logger.addHandler(lines)
    try:
        yield lines.lines
    finally:
        for logger in loggers:
            logger.removeHandler(lines)


def tp_rank(rank: int, world: int, backend: str) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = MLP()
    twin = copy.deepcopy(model)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    parallelize_module(twin, mesh, plan)
    with _logs() as lines:
        compiled = kiln.compile(model, backend=backend)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
        out_diffs, grad_diffs = [], []
        for step in range(STEPS):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))  # the same on both ranks
            a, b = compiled(x), twin(x)
            out_diffs.append((_full(a) - _full(b)).abs().max().item())
            a.square().mean().backward()
            b.square().mean().backward()
            grad_diffs.append(max((_full(p.grad) - _full(q.grad)).abs().max().item()
                                  for p, q in zip(model.parameters(), twin.parameters())))
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
    hits = sum(e.hits for cache in compiled._compiled_forward._kiln_context.caches.values() for e in cache.entries)
    return {"out": out_diffs, "grads": grad_diffs, "hits": hits, "log": lines}


def scenarios_rank(rank: int, world: int) -> dict:
    """Every scenario of this file in one rank job (one spawn of the ranks, not one per test)."""
    return {"tp": tp_rank(rank, world, "inductor"), "user_module": user_module_rank(rank, world),
            "collective": collective_rank(rank, world, "inductor")}


@pytest.fixture(scope="module")
def results(run_ranks):
    return run_ranks(scenarios_rank, timeout=900)  # kiln.inductor compiles (C++) on a shared host


@pytest.mark.slow  # kiln.inductor compiles each rank's programs (C++): default Python only
def test_tensor_parallel_matches_eager(results):
    for r in (by_scenario["tp"] for by_scenario in results):
        assert max(r["out"]) < 1e-5 and max(r["grads"]) < 1e-5, (r["out"], r["grads"])
        assert r["hits"] >= STEPS - 1  # the plain part (LayerNorm, relu, scale) ran compiled
        local = [m for m in r["log"] if "compiled as a local program" in m]
        assert len(local) == 2, r["log"]  # up (Colwise) and down (Rowwise): recorded once, reused
        subclass_lines = [m for m in r["log"] if "tensor subclasses" in m]
        assert not any("DTensor" in m for m in subclass_lines), subclass_lines
        assert len(subclass_lines) == len(set(subclass_lines))  # logged once per frame, not per call


class Scale(nn.Module):
    """A module outside torch.nn: its forward may read Python state no key holds, so over DTensors
    it runs eagerly (logged), never as a recorded program."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.w * (2.0 if self.calls % 2 else 1.0)


def user_module_rank(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    model = Scale()
    twin = Scale()
    for m in (model, twin):
        m.w = nn.Parameter(DTensor.from_local(torch.ones(8), mesh, [Replicate()]))
    with _logs() as lines:
        compiled = kiln.compile(model, backend="aot_eager")
        diffs = []
        for step in range(3):
            x = DTensor.from_local(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)), mesh,
                                   [Replicate()])
            diffs.append((compiled(x) - twin(x)).full_tensor().abs().max().item())
    return {"diffs": diffs, "log": lines}


@pytest.mark.slow  # shares the rank job of this file's inductor scenarios: default Python only
def test_user_module_over_dtensors_runs_eagerly(results):
    for r in (by_scenario["user_module"] for by_scenario in results):
        assert max(r["diffs"]) == 0.0, r["diffs"]
        assert not any("local program" in m for m in r["log"])
        assert any("tensor subclasses" in m and "DTensor" in m for m in r["log"]), r["log"]


def collective_rank(rank: int, world: int, backend: str) -> dict:
    """A Linear over DTensors whose sharding needs a collective inside its forward (input sharded on
    the contracted dimension, weight row-sharded): DTensor's redistribution is recorded as graph nodes."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Linear(8, 6)
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m.weight = nn.Parameter(distribute_tensor(m.weight.detach(), mesh, [Shard(0)]))
        m.bias = nn.Parameter(distribute_tensor(m.bias.detach(), mesh, [Replicate()]))
    with _logs() as lines:
        compiled = kiln.compile(model, backend=backend)
        out_diffs, grad_diffs = [], []
        for step in range(STEPS):
            full = torch.randn(4, 8, generator=torch.Generator().manual_seed(step)) * (rank + 1)
            x = distribute_tensor(full, mesh, [Shard(1)])
            a, b = compiled(x), twin(x)
            out_diffs.append((a.full_tensor() - b.full_tensor()).abs().max().item())
            (a.full_tensor() * full.sum()).square().mean().backward()
            (b.full_tensor() * full.sum()).square().mean().backward()
            grad_diffs.append(max((p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
                                  for p, q in zip(model.parameters(), twin.parameters())))
            for m in (model, twin):
                m.zero_grad(set_to_none=True)
    progs = list(compiled._compiled_forward._kiln_context.dtensor_programs.values())
    return {"out": out_diffs, "grads": grad_diffs, "log": lines, "wrappers": _wrappers(progs)}


def _wrappers(progs: list) -> list[str]:
    """The generated wrappers of the local programs (forward and backward) kiln.inductor compiled."""
    return [p.portable.source for prog in progs if not isinstance(prog, str)
            for p in (prog.forward, prog.backward) if getattr(p, "portable", None) is not None]


@pytest.mark.slow  # kiln.inductor compiles each rank's programs (C++): default Python only
def test_collective_inside_a_dtensor_frame_is_a_graph_node(results):
    for r in (by_scenario["collective"] for by_scenario in results):
        assert max(r["out"]) < 1e-5 and max(r["grads"]) < 1e-5, (r["out"], r["grads"])
        local = [m for m in r["log"] if "compiled as a local program" in m]
        assert len(local) == 1 and "(0 collectives)" not in local[0], r["log"]
        # both programs compiled by kiln.inductor, the redistribution's collectives inside them
        assert len(r["wrappers"]) == 2, r["log"]
        assert all("kiln.inductor generated wrapper" in w for w in r["wrappers"])
        assert sum(w.count("torch.ops._c10d_functional.wait_tensor.default(") for w in r["wrappers"]) >= 1
