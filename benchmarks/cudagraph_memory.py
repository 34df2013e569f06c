"""Memory of a CUDA graph tree vs the same graphs run without CUDA graphs (issue 8: pool <= 1.2x).

For each model and mode, in one process on the GPU:
- **no graphs**: kiln default mode; after warm-up, the peak of ``torch.cuda.max_memory_allocated``
  over one step minus what was allocated before it (weights, inputs, optimizer state).
- **graph tree**: kiln reduce-overhead; after warm-up and recording, the bytes of the private pool's
  segments (``torch.cuda.memory_snapshot``: segments whose pool id is not the default one), i.e. the
  memory the tree keeps for every recorded graph's temporaries and outputs.
The ratio is pool / peak (allocated). The pool's figure is allocator segments (rounded, fragmented),
so the plain step is also run once with its allocations in a fresh private pool (``torch.cuda.MemPool``)
and pool / that pool's segments is printed: like for like. Prints a markdown table; one line per row even when a row fails.

    python -m benchmarks.cudagraph_memory --models gpt2,resnet50 --modes inference,training
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench.models import build_for_mode
from benchmarks.kiln_bench.suite_worker import _step_fn


def _pool_bytes() -> int:
    """Bytes of allocator segments that belong to a private pool (CUDA graphs)."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        pool = seg.get("segment_pool_id", (0, 0))
        if tuple(pool) != (0, 0):
            total += int(seg["total_size"])
    return total


def _pool_active_bytes() -> int:
    """Bytes of private-pool blocks in use (allocated) now: what the tree's live outputs hold."""
    return sum(int(seg["active_size"]) for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))


def _peak_step(step: Callable[[], Any], clear_grads: Callable[[], Any] | None = None) -> int:
    """Allocated peak of one step over what was there before it (after ``clear_grads``: the step
    drops the previous step's gradients first, so they are not part of the base)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if clear_grads is not None:
        clear_grads()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


class _Events(logging.Handler):
    """The cudagraphs log's records: how many graphs were recorded and skipped (and why)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.recorded, self.skipped = 0, []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("recorded "):
            self.recorded += 1
        elif msg.startswith("skipping CUDA graphs"):
            self.skipped.append(msg.split(": ", 1)[-1][:80])


def _private_pool_step(step: Callable[[], Any], clear_grads: Callable[[], Any] | None = None) -> int | None:
    """Segment bytes one plain step (no CUDA graphs) takes when its allocations go to a fresh private
    pool (``torch.cuda.MemPool``): the same allocator, rounding and fragmentation a graph pool sees,
    so pool / this compares like with like. All threads' allocations go there: ``use_mem_pool`` routes
    only the calling thread's, and autograd runs a CUDA backward on its own thread (so a training step
    measured that way counted its forward alone). None where torch has no MemPool."""
    if not hasattr(torch.cuda, "MemPool"):
        return None
    pool = torch.cuda.MemPool()
    device = torch.cuda.current_device()
    begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if begin is None or end is None:
        return None
    begin(device, pool.id)
    try:
        out = step()
        torch.cuda.synchronize()
    finally:
        end(device, pool.id)
    total = sum(int(seg["total_size"]) for seg in torch.cuda.memory_snapshot()
                if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool.id))
    del out
    if clear_grads is not None:  # the gradients live in that pool: drop them so it can go
        clear_grads()
    return total


def _row(name: str, training: bool) -> str:
    import kiln

    dev = torch.device("cuda")
    kind = "training" if training else "inference"
    kiln.reset()  # frees the trees (and pools) of earlier rows
    gc.collect()
    torch.cuda.empty_cache()
    events = _Events()
    cg_log = logging.getLogger("kiln.cudagraphs")
    cg_log.addHandler(events)
    cg_log.setLevel(logging.INFO)
    try:
        case = build_for_mode(name, small=False, device=dev, training=training)
        plain = _step_fn(case, B.compile_fn("kiln", case.model, B.CompileSpec()), training, dev)
        clear = (lambda: case.model.zero_grad(set_to_none=True)) if training else None
        peak = _peak_step(plain, clear)
        private = _private_pool_step(plain, clear)
        del plain
        gc.collect()
        torch.cuda.empty_cache()
        before, before_active = _pool_bytes(), _pool_active_bytes()
        graphed = _step_fn(case, B.compile_fn("kiln", case.model, B.CompileSpec(mode="reduce-overhead")),
                           training, dev)
        for _ in range(4):  # warm-up, record, replays
            graphed()
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        pool = _pool_bytes() - before
        ratio = pool / peak if peak else float("nan")
        ratio_private = pool / private if private else float("nan")
        ok = "yes" if ratio <= 1.2 else "no"
        mb = 2**20
        return (f"| {name} | {kind} | {peak / mb:.1f} | {(private or 0) / mb:.1f} | {pool / mb:.1f} | "
                f"{(_pool_active_bytes() - before_active) / mb:.1f} | {ratio:.2f} | {ratio_private:.2f} | {ok} | "
                f"{events.recorded} / {len(events.skipped)} {'; '.join(sorted(set(events.skipped)))} |")
    except Exception as exc:  # noqa: BLE001 - one failed row must not hide the others
        return f"| {name} | {kind} | - | - | - | - | - | - | n/a ({B.short_error(exc, 120)}) | - |"
    finally:
        cg_log.removeHandler(events)
        gc.collect()
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="gpt2,resnet50")
    p.add_argument("--modes", default="inference,training")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("cudagraph_memory: needs a CUDA device (CUDA graphs)")
        return 0
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| model | mode | step peak without graphs MB (allocated) | the step alone in a private pool MB "
          "(segments) | graph pool MB (segments) | pool in use after replays MB | pool / peak allocated | "
          "pool / private-pool step | <= 1.2 (allocated) | "
          "graphs recorded / skipped |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            print(_row(name, mode == "training"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
