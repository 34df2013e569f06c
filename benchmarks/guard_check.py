"""Micro-benchmark: the guard check of a compiled call, kiln's native checker vs its Python checks, and
what it does to a host-bound optimizer step beside torch.compile and eager (issue 24's host time).

    uv run python -m benchmarks.guard_check [--models resnet50,mlp_stack] [--repeats 7] [--calls 300]

Part 1, per model: the guard set of kiln's compiled entry (a ResNet-50's forward on CPU, no_grad: ~930
guards over its modules; a small MLP stack) checked by ``GuardSet``'s Python check and by the native
checker, both built from the same guards, interleaved, median of ``--repeats`` x ``--calls`` checks.

Part 2: ``torch.optim.Adam(foreach=True).step()`` over 32 tensors of 16 elements (all host time: ~280
guards, 160 of them on tensors), compiled by kiln with the native checker, by kiln with Python checks
(the checker uninstalled while that copy compiles), and by torch.compile, against eager; each on its own
copy of the parameters, the four interleaved; median us per step. kiln's steps are timed on the
wrapper its tiered graph settled on (the C++ one is built once the graph is hot; here at once).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kiln
from benchmarks.kiln_bench import backends as B
from kiln.graph import guards_native
from kiln.graph.guards import _python_check
from kiln.runtime import native_guards


def _median_us(fns: dict[str, Callable[[], Any]], repeats: int, calls: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def _model(name: str) -> tuple[nn.Module, torch.Tensor]:
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50().eval(), torch.randn(1, 3, 32, 32)
    if name == "mlp_stack":
        return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32)) for _ in range(12)]), \
            torch.randn(4, 32)
    raise SystemExit(f"guard_check: unknown model {name!r} (resnet50, mlp_stack)")


def _entries(compiled: Any) -> list[Any]:
    from kiln.capture.optimize import _ALL_CONTEXTS
    ctx = next(c for c in _ALL_CONTEXTS if any(cc.entries for cc in c.caches.values()))
    return [e for cc in ctx.caches.values() for e in cc.entries]


def _guard_cost(name: str, repeats: int, calls: int) -> tuple[int, dict[str, float]]:
    """(guards, {"python": us, "native": us}) of the entry kiln compiles for ``name``'s forward."""
    model, x = _model(name)
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(x)
        entry = _entries(compiled)[0]
        arg = list(inspect.signature(type(model).forward).parameters)[1]
        frame, g = {"self": model, arg: x}, type(model).forward.__globals__
        guards = entry.guards.guards
        python = _python_check(guards)
        native = guards_native.native_check(guards, _python_check)
        if native is None or not python(frame, g) or not native(frame, g):
            raise SystemExit(f"guard_check: {name}'s entry does not pass on its own frame (or no native checker)")
        t = _median_us({"python": lambda: python(frame, g), "native": lambda: native(frame, g)}, repeats, calls)
    kiln.reset()
    return len(guards), t


def guard_costs(models: list[str], repeats: int, calls: int) -> None:
    print("| model | guards | Python check us | native check us | Python / native |")
    print("|---|---|---|---|---|")
    for name in models:
        n, t = _guard_cost(name, repeats, calls)
        print(f"| {name} | {n} | {t['python']:.1f} | {t['native']:.1f} | {t['python'] / t['native']:.2f} |")


def _adam(seed: int) -> torch.optim.Optimizer:
    torch.manual_seed(seed)
    params = [nn.Parameter(torch.randn(16)) for _ in range(32)]
    for p in params:
        p.grad = torch.randn(16)
    return torch.optim.Adam(params, lr=1e-3, foreach=True)


def adam_step(repeats: int, calls: int) -> None:
    steps: dict[str, Callable[[], Any]] = {"eager": _adam(0).step}
    steps["kiln (native guards)"] = kiln.compile(_adam(0).step)
    for _ in range(3):
        steps["kiln (native guards)"]()  # its entries compile with the checker installed
    module = guards_native.current()
    guards_native.uninstall()
    steps["kiln (Python guards)"] = kiln.compile(_adam(0).step)
    for _ in range(3):
        steps["kiln (Python guards)"]()  # its entries compile while the checker is out
    guards_native.install(module)
    steps["torch.compile"] = torch.compile(_adam(0).step)
    for step in steps.values():
        for _ in range(20):
            step()
    if B.wait_tiered("kiln") is not None:  # kiln's steady state: the step's graph on its C++ wrapper (tiered)
        for name, step in steps.items():
            if name.startswith("kiln"):
                B.settle_tiered("kiln", step)
    t = _median_us(steps, repeats, calls)
    tc = t["torch.compile"]
    print("\n| Adam step, 32 x 16 elements | us per step | torch.compile / this (speed) |")
    print("|---|---|---|")
    for name, us in t.items():
        print(f"| {name} | {us:.1f} | {tc / us:.2f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,mlp_stack")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    if not native_guards.install():
        raise SystemExit(f"guard_check: the native checker is not installed: {native_guards.reason()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    guard_costs([m for m in args.models.split(",") if m], args.repeats, args.calls)
    adam_step(args.repeats, args.calls)


if __name__ == "__main__":
    main()
