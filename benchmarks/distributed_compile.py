"""Compile once per job: cold compile wall time with 1, 2 and 4 ranks sharing one fresh cache.

For each rank count N, N processes are spawned (gloo on 127.0.0.1 for ``--device cpu``, nccl for
``--device cuda``), each builds the same model with the same seed, wraps it (``--wrap none|ddp``),
compiles it with ``kiln.compile`` and runs one training step (forward + backward) on the same
batch. Every N starts from an empty ``KILN_CACHE_DIR`` shared by its ranks (and empty
``TORCHINDUCTOR_CACHE_DIR``/``TRITON_CACHE_DIR``). The table gives, per N:

* wall s: from the barrier all ranks pass after building the model to the moment the last rank
  finished its first step (time.time(), one host),
* each rank's own first-step time (min..max),
* how many ranks compiled a graph, and how many graphs were compiled / loaded from the shared cache /
  bypassed the cache, summed over the ranks (``kiln.stats()`` cache counters and the ``cache`` log),
* with ``--torch-compile``: the same for ``torch.compile`` (its own fresh shared cache dirs), for
  reference.

  python -m benchmarks.distributed_compile --device cpu --ranks 1,2,4               # gpt2 tiny config
  python -m benchmarks.distributed_compile --device cuda --model gpt2 --ranks 1,2,4 --torch-compile

Note: on a host with fewer cores than ranks the ranks share cores (the CPU rows say so); the
loading ranks then compete with the compiling rank for CPU time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.kiln_bench.models import build


class _CacheLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _device(args: argparse.Namespace, rank: int) -> torch.device:
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    torch.set_num_threads(1)
    return torch.device("cpu")


def _wrapped(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    if args.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def _compiled(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    if backend == "kiln":
        import kiln

        return kiln.compile(model)
    return torch.compile(model)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, backend: str, out: str) -> None:
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = _device(args, rank)
        lines = _CacheLines()
        if backend == "kiln":
            import kiln

            kiln.set_logs("cache")
            logging.getLogger("kiln.cache").addHandler(lines)
            before = kiln.stats()
        case = build(args.model, small=args.device == "cpu", device=device, seed=0)
        model = _compiled(_wrapped(case.model, args, device), backend)
        amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        dist.barrier()
        start = time.time()
        with amp:
            loss = case.loss_fn(model(*case.args, **case.kwargs), case.targets)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        done = time.time()
        result: dict[str, Any] = {"rank": rank, "start": start, "done": done}
        if backend == "kiln":
            st = kiln.stats() - before
            result.update(hits=st.cache_hits, misses=st.cache_misses, compiled=st.graphs_compiled,
                          bypass=sum("bypass" in m for m in lines.lines),
                          waited=sum("while this one waited" in m for m in lines.lines),
                          compile_s=st.total_compile_seconds)
        Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world: int, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Spawn ``world`` ranks with fresh shared caches; per-rank results and the job's wall time."""
    with tempfile.TemporaryDirectory(prefix=f"kiln-dcompile-{backend}-{world}-") as tmp:
        for var, sub in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                         ("TRITON_CACHE_DIR", "triton")):
            os.environ[var] = str(Path(tmp, sub))  # the spawned ranks inherit them
        out = Path(tmp, "out")
        out.mkdir()
        t0 = time.time()
        mp.spawn(_rank, args=(world, _free_port(), args, backend, str(out)), nprocs=world)
        total = time.time() - t0
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
    firsts = [r["done"] - r["start"] for r in ranks]
    row = {"backend": backend, "world": world, "wall_s": max(r["done"] for r in ranks) - min(r["start"] for r in ranks),
           "first_min_s": min(firsts), "first_max_s": max(firsts), "job_s": total}
    if backend == "kiln":
        row.update({k: sum(r[k] for r in ranks) for k in ("hits", "misses", "compiled", "bypass", "waited")},
                   ranks_compiling=sum(r["misses"] + r["bypass"] > 0 for r in ranks),
                   ranks_loading=sum(r["hits"] > 0 and r["misses"] + r["bypass"] == 0 for r in ranks),
                   per_rank=ranks)
    return row


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    print(f"\ncold compile, {args.model}{' (tiny config)' if args.device == 'cpu' else ''}, wrap={args.wrap}, "
          f"{args.device}, {cores} cores")
    print(f"{'backend':<14}{'ranks':>6}{'wall s':>9}{'vs 1 rank':>10}{'rank first step s':>20}"
          f"{'ranks compiling/loading':>25}{'graphs compiled/loaded/bypass':>31}")
    base = {r["backend"]: r["wall_s"] for r in rows if r["world"] == 1}
    for r in rows:
        ratio = r["wall_s"] / base[r["backend"]] if r["backend"] in base else float("nan")
        spread = f"{r['first_min_s']:.2f}..{r['first_max_s']:.2f}"
        over = " (oversubscribed)" if args.device == "cpu" and r["world"] > cores else ""
        if r["backend"] == "kiln":
            who = f"{r['ranks_compiling']}/{r['ranks_loading']}"
            graphs = f"{r['misses']}/{r['hits']}/{r['bypass']}"
        else:
            who = graphs = "-"
        print(f"{r['backend']:<14}{r['world']:>6}{r['wall_s']:>9.2f}{ratio:>9.2f}x{spread:>20}{who:>25}"
              f"{graphs:>31}{over}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama_350m"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--ranks", default="1,2,4", type=lambda s: [int(n) for n in s.split(",")])
    p.add_argument("--wrap", default="none", choices=["none", "ddp"])
    p.add_argument("--torch-compile", action="store_true", help="also measure torch.compile (reference)")
    p.add_argument("--json", default="", help="write the rows to this file")
    args = p.parse_args()
    rows = []
    for backend in ["kiln"] + (["torch_compile"] if args.torch_compile else []):
        for world in args.ranks:
            rows.append(measure(world, backend, args))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_rank"}), flush=True)
    _print(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
