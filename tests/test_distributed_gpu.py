"""DDP and FSDP2 under kiln.compile (inductor) on 2 GPUs with NCCL, AMP bf16, against eager twins
fed the same per-rank batches: every step's gradients within bf16 noise (relative to the largest
eager gradient); functional collectives called from kiln.inductor's Triton programs. Needs 2 CUDA
GPUs; marked ``gpu`` (CI skips it)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln

STEPS = 6
REL_TOL = 3e-2  # bf16 matmuls: eager against eager with another reduction order differs ~1e-2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 256, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).float()


def _rel_diff(a: nn.Module, b: nn.Module) -> float:
    scale = max(_full(q.grad).abs().max().item() for q in b.parameters()) or 1.0
    return max((_full(p.grad) - _full(q.grad)).abs().max().item() for p, q in zip(a.parameters(), b.parameters())) / scale


def ddp_rank(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    net = Net().cuda()
    twin_net = copy.deepcopy(net)
    twin_group = dist.new_group(backend="nccl")
    ddp = DDP(net, device_ids=[rank])
    twin = DDP(twin_net, device_ids=[rank], process_group=twin_group)
    compiled = kiln.compile(ddp)
    diffs = _steps_ddp(compiled, net, twin, twin_net, rank)
    return {"diffs": diffs}


def _steps_ddp(compiled: nn.Module, net: nn.Module, twin: nn.Module, twin_net: nn.Module, rank: int) -> list[float]:
    opts = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (net, twin_net)]
    diffs = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 64, 256, generator=gen).cuda()
        for m in (compiled, twin):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(x).float().square().mean()
            loss.backward()
        diffs.append(_rel_diff(net, twin_net))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return diffs


def fsdp_rank(rank: int, world: int, whole: bool) -> dict:
    """FSDP2 with bf16 parameters: torchtitan's recipe (kiln.compile each block, then fully_shard each
    block and the root), or kiln.compile of the sharded model (``whole``)."""
    torch.manual_seed(0)
    model = Net().cuda()
    twin = copy.deepcopy(model)
    mesh = init_device_mesh("cuda", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for m, compile_blocks in ((model, not whole), (twin, False)):
        for i, block in enumerate(m.blocks):
            if compile_blocks:
                m.blocks[i] = kiln.compile(block)
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(m, mesh=mesh, mp_policy=mp)
    run = kiln.compile(model) if whole else model
    return {"diffs": _steps_with(run, model, twin, rank)}


def _steps_with(run: nn.Module, model: nn.Module, twin: nn.Module, rank: int) -> list[float]:
    opts = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (model, twin)]
    diffs = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 64, 256, generator=gen).cuda()
        for m in (run, twin):
            loss = m(x).float().square().mean()
            loss.backward()
        diffs.append(_rel_diff(model, twin))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return diffs


def test_ddp_nccl_matches_eager_ddp(run_ranks):
    for r in run_ranks(ddp_rank, backend="nccl", timeout=600):
        assert max(r["diffs"]) < REL_TOL, r["diffs"]


@pytest.mark.parametrize("whole", [False, True], ids=["per_block", "whole_model"])
def test_fsdp2_nccl_matches_eager_fsdp2(run_ranks, whole):
    for r in run_ranks(fsdp_rank, whole, backend="nccl", timeout=600):
        assert max(r["diffs"]) < REL_TOL, r["diffs"]


def two_all_reduces(x: torch.Tensor) -> torch.Tensor:
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    z = funcol.all_reduce(y.sin() * 3, "max", dist.group.WORLD)
    return z + y


def gather_in_flight(x: torch.Tensor) -> torch.Tensor:
    """Work on the compute stream while the all-gather runs on NCCL's: the operand's memory must not
    be reused before the wait, nor the output's while the wait's result is read."""
    a = x * 2
    h = torch.ops._c10d_functional.all_gather_into_tensor(a, 2, dist.group.WORLD.group_name)
    b = (x.cos() + 1).sin() * 3
    g = torch.ops._c10d_functional.wait_tensor(h)
    y = g * 2 + 1
    return (y + g) * torch.cat([b, b])


def collectives_rank(rank: int, world: int) -> dict:
    """Functional collectives inside kiln.inductor's Triton programs (called from the wrapper), 3 calls
    with fresh inputs each, against eager; and the generated wrapper holds the collectives."""
    out: dict = {}
    for fn in (two_all_reduces, gather_in_flight):
        compiled = kiln.compile(fn)
        diffs = []
        for i in range(3):
            x = (torch.linspace(-1, 1, 1 << 16) * (rank + 1 + i)).cuda()
            diffs.append((compiled(x.clone()) - fn(x.clone())).abs().max().item())
        caches = compiled._optimized._kiln_context.caches.values()
        wrappers = [e.compiled.portable.source for c in caches for e in c.entries if e.compiled is not None]
        out[fn.__name__] = {"diffs": diffs, "inside": bool(wrappers) and all(
            "torch.ops._c10d_functional.wait_tensor.default(" in w for w in wrappers)}
    return out


def test_functional_collectives_nccl_inside_inductor(run_ranks):
    for r in run_ranks(collectives_rank, backend="nccl", timeout=600):
        for name, got in r.items():
            assert max(got["diffs"]) < 1e-4, (name, got["diffs"])
            assert got["inside"], name
