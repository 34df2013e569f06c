"""Collectives in user code under kiln.compile, 2 CPU ranks (gloo), each function called 3 times
with fresh inputs against eager: functional collectives (``torch.distributed._functional_collectives``
and ``torch.ops._c10d_functional``) are graph nodes in program order; ``dist.all_reduce`` on a tensor
(an in-place call on a process group) breaks the graph and runs in Python on every call. Before, the
in-place all-reduce ran once on fake tensors at capture and was silently missing from the graph."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

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


def _graphs_backend(texts: list[str]):
    def backend(gm, example_inputs):
        texts.append(str(gm.graph))
        return gm.forward
    return backend


def collectives_rank(rank: int, world: int) -> dict:
    out: dict = {}
    for fn in (inplace_collectives, functional_collectives, functional_ops):
        texts: list[str] = []
        compiled = kc.optimize(fn, _graphs_backend(texts))
        aot = kiln.compile(fn, backend="aot_eager")
        diffs = []
        for i in range(3):
            x = torch.linspace(-1, 1, 6) * (rank + 1 + i)
            want = fn(x.clone())
            diffs.append(max((compiled(x.clone()) - want).abs().max().item(),
                             (aot(x.clone()) - want).abs().max().item()))
        out[fn.__name__] = {"diffs": diffs, "graphs": texts}
    return out


@pytest.fixture(scope="module")
def results(run_ranks):
    return run_ranks(collectives_rank)


@pytest.mark.parametrize("name", ["inplace_collectives", "functional_collectives", "functional_ops"])
def test_collectives_match_eager_every_call(results, name):
    for by_fn in results:
        assert max(by_fn[name]["diffs"]) < 1e-5, by_fn[name]["diffs"]


def test_functional_collectives_are_graph_nodes_in_order(results):
    graphs = results[0]["functional_collectives"]["graphs"]
    assert len(graphs) == 1  # one graph, no break
    text = graphs[0]
    first, second = text.index("_c10d_functional.all_reduce"), text.rindex("_c10d_functional.all_reduce")
    assert first < text.index("sin") < second
    assert ", sum," in text[first:text.index("sin")] and ", max," in text[second:]


def test_inplace_all_reduce_breaks_the_graph(results):
    graphs = results[0]["inplace_collectives"]["graphs"]
    assert len(graphs) >= 2 and not any("allreduce" in g for g in graphs)
