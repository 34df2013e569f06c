"""Memory of a CUDA graph tree vs the same graphs run without CUDA graphs (issue 8: pool <= 1.2x).

For each model and mode, in one process on the GPU:
- **no graphs**: kiln default mode; after warm-up, the peak of ``torch.cuda.max_memory_allocated``
  over one step minus what was allocated before it (weights, inputs, optimizer state).
- **graph tree**: kiln reduce-overhead; after warm-up and recording, the bytes of the private pool's
  segments (``torch.cuda.memory_snapshot``: segments whose pool id is not the default one), i.e. the
  memory the tree keeps for every recorded graph's temporaries and outputs.
The ratio is pool / peak. Prints a markdown table; one line per row even when a row fails.

    python -m benchmarks.cudagraph_memory --models gpt2,resnet50 --modes inference,training
"""

from __future__ import annotations

import argparse
import gc
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


def _peak_step(step: Callable[[], Any]) -> int:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _row(name: str, training: bool) -> str:
    dev = torch.device("cuda")
    kind = "training" if training else "inference"
    try:
        case = build_for_mode(name, small=False, device=dev, training=training)
        plain = _step_fn(case, B.compile_fn("kiln", case.model, B.CompileSpec()), training, dev)
        peak = _peak_step(plain)
        del plain
        gc.collect()
        torch.cuda.empty_cache()
        before = _pool_bytes()
        graphed = _step_fn(case, B.compile_fn("kiln", case.model, B.CompileSpec(mode="reduce-overhead")),
                           training, dev)
        for _ in range(4):  # warm-up, record, replays
            graphed()
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        pool = _pool_bytes() - before
        ratio = pool / peak if peak else float("nan")
        ok = "yes" if ratio <= 1.2 else "no"
        return f"| {name} | {kind} | {peak / 2**20:.1f} | {pool / 2**20:.1f} | {ratio:.2f} | {ok} |"
    except Exception as exc:  # noqa: BLE001 - one failed row must not hide the others
        return f"| {name} | {kind} | - | - | - | n/a ({B.short_error(exc, 120)}) |"
    finally:
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
    print("| model | mode | step peak without graphs MB | graph pool MB | pool / peak | <= 1.2 |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            print(_row(name, mode == "training"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
