"""kiln.compile(DistributedDataParallel(model)) on 2 CPU ranks (gloo) against an eager DDP twin:
gradients every step over 10 steps, with no_sync accumulation, find_unused_parameters,
static_graph, and BatchNorm buffers (broadcast from rank 0 each forward) with train/eval switches.
Before DDP's forward ran in Python on every call, the all-reduce happened on the first step only
(each rank then kept its local gradients), silently."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln

STEPS = 10


class Net(nn.Module):
    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16) if batch_norm else nn.Identity()
        self.fc2 = nn.Linear(16, 4)
        self.extra = nn.Linear(16, 4)  # used only when forward(use_extra=True)

    def forward(self, x: torch.Tensor, use_extra: bool = True) -> torch.Tensor:
        h = torch.relu(self.norm(self.fc1(x)))
        y = self.fc2(h)
        return y + self.extra(h).sigmoid() if use_extra else y


def _max_diff(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> float:
    out = 0.0
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return float("inf")
        if x is not None:
            out = max(out, (x - y).abs().max().item())
    return out


def _grads(m: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in m.parameters()]


def _compiled_hits(compiled: nn.Module) -> int:
    """Cache hits of the frames compiled under this kiln.compile (the DDP-wrapped forward's)."""
    ctx = compiled._compiled_forward._kiln_context
    calls = [c for per_module in ctx.python_calls.values() for c in per_module.values()]
    caches = [c.routed.compiled.cache for c in calls]
    return sum(e.hits for cache in caches for e in cache.entries)


def ddp_scenario(rank: int, world: int, scenario: str, backend: str) -> dict:
    """One scenario on this rank: kiln-compiled DDP and an eager DDP twin (own process group) fed the
    same per-rank batches; the gradient differences each step, and against purely local gradients."""
    torch.manual_seed(0)
    net = Net(batch_norm=scenario == "batch_norm")
    twin, local = copy.deepcopy(net), copy.deepcopy(net)
    kw: dict = {}
    if scenario == "find_unused":
        kw["find_unused_parameters"] = True
    if scenario == "static_graph":
        kw["static_graph"] = True
    if scenario == "buckets":  # ~500 bytes per bucket: the compiled forward is split into pieces
        kw["bucket_cap_mb"] = 500 / 2**20
    early: list[bool] = []  # at the last layer's gradient: is the first layer's still to come?
    net.extra.weight.register_post_accumulate_grad_hook(lambda p: early.append(net.fc1.weight.grad is None))
    ddp = DDP(net, **kw)
    ddp_twin = DDP(twin, process_group=dist.new_group(), **kw)
    compiled = kiln.compile(ddp, backend=backend)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (net, twin, local)]
    diffs, local_diffs = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)  # different data on each rank
        use_extra = scenario != "find_unused" or step % 2 == 0
        micro = [torch.randn(6, 8, generator=g) for _ in range(2 if scenario == "no_sync" else 1)]
        if scenario == "batch_norm":  # DDP broadcasts rank 0's running statistics before each forward
            for model in (compiled, ddp_twin, local):
                model.train(step % 3 != 2)
        for i, x in enumerate(micro):
            last = i == len(micro) - 1
            for model, is_ddp in ((compiled, True), (ddp_twin, True), (local, False)):
                ctx = model.no_sync() if is_ddp and not last else _null()
                with ctx:
                    model(x, use_extra=use_extra).square().mean().backward()
            if not last:  # accumulated locally under no_sync: equal to the twin's, not yet reduced
                assert _max_diff(_grads(net), _grads(twin)) < 1e-6
        diffs.append(_max_diff(_grads(net), _grads(twin)))
        local_diffs.append(_max_diff(_grads(net), _grads(local)))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():  # the local model follows the DDP twin, so it only differs by the reduction
            for p, q in zip(local.parameters(), twin.parameters()):
                p.copy_(q)
    params = _max_diff([p.detach() for p in net.parameters()], [p.detach() for p in twin.parameters()])
    params = max(params, _max_diff(list(net.buffers()), list(twin.buffers())))
    return {"diffs": diffs, "local_diffs": local_diffs, "params": params, "hits": _compiled_hits(compiled),
            "early": early}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


SCENARIOS = ("plain", "no_sync", "find_unused", "static_graph", "buckets", "batch_norm")


def ddp_scenarios(rank: int, world: int, backend: str, scenarios: tuple[str, ...]) -> dict:
    return {s: ddp_scenario(rank, world, s, backend) for s in scenarios}


def file_rank(rank: int, world: int) -> dict:
    """Every aot_eager scenario, and the plain one with kiln.inductor (``"inductor"``): one rank job."""
    return {"aot_eager": ddp_scenarios(rank, world, "aot_eager", SCENARIOS),
            "inductor": ddp_scenarios(rank, world, "inductor", ("plain",))}


@pytest.fixture(scope="module")
def results(run_ranks):
    return run_ranks(file_rank, timeout=600)  # one spawn for all scenarios; inductor compiles C++


@pytest.fixture(scope="module")
def aot_eager_results(results):
    return [by_backend["aot_eager"] for by_backend in results]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ddp_matches_eager_ddp_every_step(aot_eager_results, scenario):
    for rank, by_scenario in enumerate(aot_eager_results):
        r = by_scenario[scenario]
        assert max(r["diffs"]) < 1e-5, (rank, r["diffs"])  # every step, not only the first
        assert r["params"] < 1e-5
        # the all-reduce mattered: the ranks' own gradients differ from the reduced ones each step
        assert min(r["local_diffs"]) > 1e-3, (rank, r["local_diffs"])
        assert r["hits"] >= STEPS - 3, r["hits"]  # the wrapped forward ran compiled
        if scenario == "buckets":  # pieces: the last layer's gradient is final (its bucket can be
            assert r["early"] and all(r["early"]), r["early"]  # all-reduced) before the first's exists


def test_ddp_inductor_matches_eager_ddp(results):
    for by_scenario in (by_backend["inductor"] for by_backend in results):
        r = by_scenario["plain"]
        assert max(r["diffs"]) < 1e-4, r["diffs"]
        assert min(r["local_diffs"]) > 1e-3
        assert r["hits"] >= STEPS - 1
