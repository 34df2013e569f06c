"""Does compiling and running a model with one backend slow later host calls in the process? Prints
the host cost of one addmm and one allocation before and after (the GPU machine's host speed drifts:
the same addmm measured 13-21 us in one process, which is why the suite alternates backends).

    python benchmarks/host_drift.py kiln gpt2      # or torch_compile
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.host_probe import _us as us
from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench.models import build_for_mode
from benchmarks.kiln_bench.suite_worker import _step_fn

DEV = "cuda"


def report(tag: str) -> None:
    x = torch.randn(64, 768, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(2304, 768, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(2304, device=DEV, dtype=torch.bfloat16)
    a = us(lambda: torch.addmm(b, x, w.t()))
    e = us(lambda: torch.empty_strided((64, 2304), (2304, 1), dtype=torch.bfloat16, device=DEV))
    print(f"{tag:40s} addmm {a:6.2f} us  empty {e:5.2f} us  threads {threading.active_count()} "
          f"tasks {len(os.listdir('/proc/self/task'))} gc objects {len(gc.get_objects())}", flush=True)


def steps_ms(step: Callable[[], object], n: int = 20) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    which = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
    report("fresh")
    case = build_for_mode(model, small=False, device=torch.device(DEV), training=False)
    report("model built")
    spec = B.CompileSpec(kiln_backend="inductor", tc_backend="inductor", mode=None)
    step = _step_fn(case, B.compile_fn(which, case.model, spec), False, torch.device(DEV))
    step()
    report(f"{which} compiled + first call")
    for _ in range(5):
        step()
    print(f"step ms (pipelined) {steps_ms(step):.3f}")
    report(f"{which} after steps")
    gc.collect()
    gc.freeze()
    report("after gc.freeze")
    print(f"step ms (pipelined, gc frozen) {steps_ms(step):.3f}")


if __name__ == "__main__":
    main()
