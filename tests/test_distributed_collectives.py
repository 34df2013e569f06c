"""Collectives in user code under kiln.compile, 2 CPU ranks (gloo), each function called 3 times
with fresh inputs against eager: functional collectives (``torch.distributed._functional_collectives``
and ``torch.ops._c10d_functional``) are graph nodes in program order; ``dist.all_reduce`` on a tensor
(an in-place call on a process group) breaks the graph and runs in Python on every call. Before, the
in-place all-reduce ran once on fake tensors at capture and was silently missing from the graph.

With kiln.inductor (C++ kernels) the collectives run inside the generated wrapper. Before, its memory
plan handed a collective's output to a later buffer while the wait's alias of it was still read (two
all-reduces in a row: wrong values on every call), and nothing kept a collective's operand from being
reused while the communication still read it (``in_flight``).

A frame called with a pending collective result (an ``AsyncCollectiveTensor``, also inside a list)
waits for it at the call and compiles over its value. Before, it ran eagerly; and a frame compiled for
plain tensors, then called with one, passed its tensor guards and handed the wrapper (no storage) to
its kernels: a segmentation fault."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed._functional_collectives import (
    AsyncCollectiveTensor,
    all_gather_tensor_autograd,
)

import kiln
import kiln.capture as kc


def inplace_collectives(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    dist.all_reduce(y)
    z = y.sin() * 3
    dist.all_reduce(z, op=dist.ReduceOp.MAX)  # order matters: SUM then MAX
    return z + y


def functional_collectives(x: torch.Tensor) -> torch.Tensor:
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    z = funcol.all_reduce(y.sin() * 3, "max", dist.group.WORLD)
    return z + y


def functional_ops(x: torch.Tensor) -> torch.Tensor:
    y = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x * 3, "sum", "0"))
    return y - 1


def in_flight(x: torch.Tensor) -> torch.Tensor:
    """Work between a collective and its wait: buffers of the operand's size are made and die while
    the all-gather is in flight, and one of the output's size while the wait's result is still read."""
    group = dist.group.WORLD.group_name
    a = x * 2
    h = torch.ops._c10d_functional.all_gather_into_tensor(a, 2, group)
    b = (x.cos() + 1).sin() * 3
    g = torch.ops._c10d_functional.wait_tensor(h)
    y = g * 2 + 1
    return (y + g) * torch.cat([b, b])


def coalesced(x: torch.Tensor) -> torch.Tensor:
    """One call reduces two tensors; each result has its own wait, with work between them."""
    group = dist.group.WORLD.group_name
    a, b = torch.ops._c10d_functional.all_reduce_coalesced([x * 2, x.cos()], "sum", group)
    c = x.sin() * 5
    a = torch.ops._c10d_functional.wait_tensor(a)
    b = torch.ops._c10d_functional.wait_tensor(b)
    return a * b + c


FUNCTIONS = (inplace_collectives, functional_collectives, functional_ops, in_flight, coalesced)


def _graphs_backend(texts: list[str]):
    def backend(gm, example_inputs):
        texts.append(str(gm.graph))
        return gm.forward
    return backend


def _wrappers(compiled) -> list[str]:
    """The generated programs of a kiln.compile'd function's cache entries (compiled here or loaded)."""
    caches = compiled._optimized._kiln_context.caches.values()
    return [e.compiled.portable.source for cache in caches for e in cache.entries
            if e.compiled is not None and e.compiled.portable is not None]


def collectives_rank(rank: int, world: int) -> dict:
    out: dict = {}
    for fn in FUNCTIONS:
        texts: list[str] = []
        compiled = kc.optimize(fn, _graphs_backend(texts))
        aot = kiln.compile(fn, backend="aot_eager")
        inductor = kiln.compile(fn)
        diffs, inductor_diffs = [], []
        for i in range(3):
            x = torch.linspace(-1, 1, 6) * (rank + 1 + i)
            want = fn(x.clone())
            diffs.append(max((compiled(x.clone()) - want).abs().max().item(),
                             (aot(x.clone()) - want).abs().max().item()))
            inductor_diffs.append((inductor(x.clone()) - want).abs().max().item())
        out[fn.__name__] = {"diffs": diffs, "graphs": texts, "inductor": inductor_diffs,
                            "wrappers": _wrappers(inductor)}
    return out


def file_rank(rank: int, world: int) -> dict:
    """Every function of FUNCTIONS, and the pending-results scenario (``"pending"``), in one rank job."""
    out = collectives_rank(rank, world)
    out["pending"] = pending_rank(rank, world)
    return out


@pytest.fixture(scope="module")
def results(run_ranks):
    return run_ranks(file_rank, timeout=600)  # inductor compiles (C++) on a shared host


NAMES = [fn.__name__ for fn in FUNCTIONS]


@pytest.mark.slow  # one rank job compiles every function with kiln.inductor (C++): default Python only
@pytest.mark.parametrize("name", NAMES)
def test_collectives_match_eager_every_call(results, name):
    for by_fn in results:
        assert max(by_fn[name]["diffs"]) < 1e-5, by_fn[name]["diffs"]


@pytest.mark.slow  # one rank job compiles every function with kiln.inductor (C++): default Python only
@pytest.mark.parametrize("name", NAMES)
def test_inductor_matches_eager_every_call(results, name):
    for by_fn in results:
        assert max(by_fn[name]["inductor"]) < 1e-5, by_fn[name]["inductor"]


@pytest.mark.slow  # one rank job compiles every function with kiln.inductor (C++): default Python only
@pytest.mark.parametrize("name", ["functional_collectives", "functional_ops", "in_flight", "coalesced"])
def test_functional_collectives_run_inside_the_generated_wrapper(results, name):
    for by_fn in results:
        (wrapper,) = by_fn[name]["wrappers"]  # one graph, compiled by kiln.inductor: no eager fallback
        assert "kiln.inductor generated wrapper" in wrapper
        issued = wrapper.count("torch.ops._c10d_functional.all_")
        assert 1 <= issued <= wrapper.count("torch.ops._c10d_functional.wait_tensor.default(")


@pytest.mark.slow  # one rank job compiles every function with kiln.inductor (C++): default Python only
def test_functional_collectives_are_graph_nodes_in_order(results):
    graphs = results[0]["functional_collectives"]["graphs"]
    assert len(graphs) == 1  # one graph, no break
    text = graphs[0]
    first, second = text.index("_c10d_functional.all_reduce"), text.rindex("_c10d_functional.all_reduce")
    assert first < text.index("sin") < second
    assert ", sum," in text[first:text.index("sin")] and ", max," in text[second:]


@pytest.mark.slow  # one rank job compiles every function with kiln.inductor (C++): default Python only
def test_inplace_all_reduce_breaks_the_graph(results):
    graphs = results[0]["inplace_collectives"]["graphs"]
    assert len(graphs) >= 2 and not any("allreduce" in g for g in graphs)


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2 + 1


def mixed(x: torch.Tensor, ys: list[torch.Tensor]) -> torch.Tensor:
    return x.cos() * ys[0] + ys[1]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _pending_list(x: torch.Tensor) -> list[torch.Tensor]:
    return [funcol.all_reduce(x * 2, "sum", dist.group.WORLD), funcol.all_gather_tensor(x[:3], 0, dist.group.WORLD)]


def pending_rank(rank: int, world: int) -> dict:
    lines = _Lines()
    kiln.set_logs("graph_breaks", "distributed")
    for name in ("graph_breaks", "distributed"):
        logging.getLogger(f"kiln.{name}").addHandler(lines)
    world_group = dist.group.WORLD
    one, two = kiln.compile(scaled), kiln.compile(mixed)
    diffs, kinds = [], set()
    for i in range(3):  # plain tensors first: the entry's guards must not take the wrapper later
        x = torch.linspace(-1, 1, 6) * (rank + 1 + i)
        diffs.append((one(x) - scaled(x)).abs().max().item())
    for i in range(3):
        x = torch.linspace(-1, 1, 6) * (rank + 1 + i)
        pending = funcol.all_reduce(x, "sum", world_group)
        kinds.add(type(pending).__name__)
        diffs.append((one(pending) - scaled(funcol.all_reduce(x, "sum", world_group))).abs().max().item())
        diffs.append((two(x, _pending_list(x)) - mixed(x, _pending_list(x))).abs().max().item())
    grad_diffs = []
    for i in range(3):  # gradients flow through the wait (an all-gather with autograd)
        w = torch.linspace(-1, 1, 3).requires_grad_()
        w2 = w.detach().clone().requires_grad_()
        a = all_gather_tensor_autograd(w * (rank + 1 + i), 0, world_group)
        kinds.add(type(a).__name__)
        one(a).square().sum().backward()
        scaled(all_gather_tensor_autograd(w2 * (rank + 1 + i), 0, world_group)).square().sum().backward()
        grad_diffs.append((w.grad - w2.grad).abs().max().item())
    for name in ("graph_breaks", "distributed"):
        logging.getLogger(f"kiln.{name}").removeHandler(lines)
    entries = [e for f in (one, two) for c in f._optimized._kiln_context.caches.values() for e in c.entries]
    return {"diffs": diffs, "grads": grad_diffs, "kinds": kinds, "log": lines.lines,
            "eager": sum(e.capture is None for e in entries), "hits": sum(e.hits for e in entries)}


@pytest.mark.slow  # shares the rank job of the inductor tests above: default Python only
def test_pending_collective_results_are_waited_for_at_the_call(results):
    for r in (by_name["pending"] for by_name in results):
        assert r["kinds"] == {AsyncCollectiveTensor.__name__}
        assert max(r["diffs"]) < 1e-5 and max(r["grads"]) < 1e-5, (r["diffs"], r["grads"])
        assert r["eager"] == 0 and not any("eagerly" in m for m in r["log"]), r["log"]
        assert r["hits"] >= 8  # the plain-tensor entries serve the waited values
        waits = [m for m in r["log"] if "pending collective" in m]
        assert len(waits) == 2, r["log"]  # logged once per frame
