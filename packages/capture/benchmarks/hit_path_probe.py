"""Capture's own hit-path cost, with the graph replaced by a no-op: what kiln.capture adds per call.

    uv run python packages/capture/benchmarks/hit_path_probe.py

The overhead benchmark (benchmarks/overhead.py) measures compiled - direct through kiln.compile;
for the 100-parameter module the graph itself (~250-600 us) dominates and the difference is noise on
a loaded machine. Here the backend returns a function that does nothing, so the time per call is
bind + guard check (with the pinned parameters' layout check) + argument extraction + output plan.
"""

import time

import torch

import kiln.capture as kc
from kiln.capture.pinned_layouts import EPOCH


def bench(fn, n=5000):
    best = 1e9
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    torch.set_num_threads(1)
    out = (torch.randn(2, 4),)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(100)])
    x = torch.randn(2, 4)
    opt = kc.optimize(model, lambda gm, ex: (lambda *a: out))
    opt(x)
    entry = kc.cache_entries(opt)[0]
    L = opt._kiln_optimized.bind((x,), {})
    guards_only = entry.guards.compile()
    assert entry.layouts is not None
    print(f"module, 200 params: {bench(lambda: opt(x)):.2f} us per call "
          f"(entry check {bench(lambda: entry.check(L, {})):.2f} us: guards {bench(lambda: guards_only(L, {})):.2f} "
          f"us, {len(entry.guards.guards)} guards; pinned layouts {bench(entry.layouts.same):.3f} us, "
          f"{len(entry.layouts.tensors)} tensors)")

    def after_relayout() -> bool:  # what the first call after any `.data = ...` in the process pays
        EPOCH[0] += 1
        return entry.layouts.same()
    print(f"pinned layouts compared after a layout change: {bench(after_relayout, 200):.2f} us")

    def f(a, b):
        return a + b
    opt2 = kc.optimize(f, lambda gm, ex: (lambda *a: out))
    opt2(x, x)
    print(f"f(x, y):            {bench(lambda: opt2(x, x)):.2f} us per call")


if __name__ == "__main__":
    main()
