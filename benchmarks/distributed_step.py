"""Distributed training step: DDP and FSDP2, kiln vs eager vs torch.compile.

Each backend trains the same model (same seed, same per-rank batches) with AMP bf16 on CUDA (fp32 on
CPU); rank 0 prints the median step time, the ratio to eager, the first-step (compile) time and the
largest gradient difference to eager's first step, relative to eager's largest gradient.

  torchrun --nproc-per-node 2 benchmarks/distributed_step.py --model gpt2 --wrap ddp
  torchrun --nproc-per-node 2 benchmarks/distributed_step.py --model llama_350m --wrap fsdp2
  python benchmarks/distributed_step.py --nproc 2 --device cpu --small --wrap ddp     # mp.spawn, gloo

FSDP2 follows torchtitan: each transformer block compiled (kiln.compile / torch.compile), then
``fully_shard`` on each block and on the root. DDP compiles the DDP-wrapped model as a whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.kiln_bench.models import build

BACKENDS = ("eager", "kiln", "torch_compile")


def _blocks(model: nn.Module) -> tuple[nn.ModuleList, list[int]]:
    """The transformer blocks: the longest nn.ModuleList in the model."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    blocks = max(lists, key=len)
    return blocks, list(range(len(blocks)))


def _compile(module: nn.Module, backend: str) -> nn.Module:
    if backend == "kiln":
        import kiln

        return kiln.compile(module)
    if backend == "torch_compile":
        return torch.compile(module)
    return module


def _wrap(model: nn.Module, wrap: str, backend: str, device: torch.device) -> nn.Module:
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return _compile(ddp, backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    blocks, ids = _blocks(model)
    for i in ids:
        blocks[i] = _compile(blocks[i], backend)
    for i in ids:
        fully_shard(blocks[i], mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _grads(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        g = p.grad
        if g is None:
            out.append(torch.zeros(()))
            continue
        full = g.full_tensor() if hasattr(g, "full_tensor") else g
        out.append(full.detach().float().cpu())
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_backend(backend: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    case = build(args.model, small=args.small, device=device, seed=0)
    model = _wrap(case.model, args.wrap, backend, device)
    params = case.model.parameters() if args.wrap == "ddp" else model.parameters()
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own batch; the same for every backend
    ids = torch.randint(0, int(case.targets.max()) + 1, case.args[0].shape, generator=gen).to(device)
    targets = torch.randint(0, int(case.targets.max()) + 1, case.targets.shape, generator=gen).to(device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    times: list[float] = []
    first_grads: list[torch.Tensor] = []
    first_step = 0.0
    for step in range(args.warmup + args.steps):
        _sync(device)
        t0 = time.perf_counter()
        with amp:
            loss = case.loss_fn(model(ids, **case.kwargs), targets)
        loss.backward()
        if step == 0:
            _sync(device)
            first_step = time.perf_counter() - t0
            first_grads = _grads(case.model if args.wrap == "ddp" else model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {"median_ms": 1e3 * statistics.median(times), "first_s": first_step, "grads": first_grads}


def worker(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    if torch.cuda.is_available() and args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    results: dict[str, dict[str, Any]] = {}
    for backend in args.backends:
        try:
            results[backend] = run_backend(backend, args, device)
        except Exception as e:  # noqa: BLE001 - reported in the table, the other backends still run
            results[backend] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        dist.barrier()
    if rank != 0:
        return
    ref = results.get("eager", {})
    print(f"\n{args.wrap} {args.model}{' (small)' if args.small else ''}, {dist.get_world_size()} ranks, "
          f"{device.type}, AMP bf16={device.type == 'cuda'}, {args.steps} timed steps")
    print(f"{'backend':<15}{'step ms':>10}{'vs eager':>10}{'first step s':>14}{'max grad diff (rel)':>22}")
    for backend, r in results.items():
        if "error" in r:
            print(f"{backend:<15}  error: {r['error']}")
            continue
        ratio = ref["median_ms"] / r["median_ms"] if "median_ms" in ref else float("nan")
        if "grads" in ref:
            scale = max(g.abs().max().item() for g in ref["grads"]) or 1.0
            diff = max((a - b).abs().max().item() for a, b in zip(r["grads"], ref["grads"])) / scale
        else:
            diff = float("nan")
        print(f"{backend:<15}{r['median_ms']:>10.2f}{ratio:>9.2f}x{r['first_s']:>14.2f}{diff:>22.2e}")


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        worker(args)
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama_350m"])
    p.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp2"])
    p.add_argument("--backends", default=",".join(BACKENDS), type=lambda s: s.split(","))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--small", action="store_true", help="tiny model configs (CPU smoke runs)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not under torchrun")
    args = p.parse_args()
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        try:
            worker(args)
        finally:
            dist.destroy_process_group()
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args.nproc, port, args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
