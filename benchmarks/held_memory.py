"""Which CUDA tensors does a kiln-compiled model keep alive between calls, and who holds them (the
first referrer chain of the largest)? Run on the GPU machine; found the attention-choice tensors
(1 GB for ViT) in session 5.

    python benchmarks/held_memory.py vit_base_patch16_224
"""

from __future__ import annotations

import gc
import sys
import types
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench.models import build_for_mode
from benchmarks.kiln_bench.suite_worker import _step_fn


def chain(o: Any, skip: set[int], depth: int = 0, max_depth: int = 5) -> None:
    """Print the first referrer of ``o``, then of that, up to ``max_depth`` (frames skipped)."""
    for r in gc.get_referrers(o):
        if id(r) in skip or isinstance(r, types.FrameType):
            continue
        skip.add(id(r))
        desc = type(r).__name__
        if isinstance(r, dict):
            desc += f" keys={[k for k, v in r.items() if v is o][:3]} len={len(r)}"
        elif isinstance(r, (list, tuple)):
            desc += f" len={len(r)}"
        elif isinstance(r, types.FunctionType):
            desc += f" {r.__qualname__} in {r.__module__}"
        print("  " * (depth + 1) + desc[:200])
        if depth < max_depth and not isinstance(r, types.ModuleType):
            chain(r, skip, depth + 1, max_depth)
        return


def main() -> None:
    dev = torch.device("cuda")
    case = build_for_mode(sys.argv[1], small=False, device=dev, training=False)
    known = {t.data_ptr() for t in [*case.model.parameters(), *case.model.buffers(), *case.args,
                                    *case.kwargs.values()] if isinstance(t, torch.Tensor)}
    spec = B.CompileSpec(kiln_backend="inductor", tc_backend="inductor", mode=None)
    step = _step_fn(case, B.compile_fn("kiln", case.model, spec), False, dev)
    step()
    torch.cuda.synchronize()
    gc.collect()
    print(f"allocated {torch.cuda.memory_allocated() / 2**20:.1f} MB")
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda
               and o.data_ptr() not in known]
    storages: dict[int, tuple[int, torch.Tensor]] = {}
    for t in tensors:
        storages.setdefault(t.untyped_storage().data_ptr(), (t.untyped_storage().nbytes(), t))
    print(f"{len(tensors)} other CUDA tensors, {len(storages)} storages, "
          f"{sum(n for n, _ in storages.values()) / 2**20:.1f} MB")
    biggest = sorted(storages.values(), key=lambda v: -v[0])[:6]
    skip = {id(tensors), id(biggest), id(storages)}
    for nbytes, t in biggest:
        print(f"{nbytes / 2**20:.1f} MB {tuple(t.shape)} {t.dtype} {tuple(t.stride())}")
        chain(t, set(skip))


if __name__ == "__main__":
    main()
