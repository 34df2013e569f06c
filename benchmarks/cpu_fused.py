"""Micro-benchmark (c): fused pointwise/reduction workloads, eager vs kiln vs torch.compile.

    uv run python -m benchmarks.cpu_fused [--small] [--device cpu] [--threads N] [--rounds R] [--out DIR]

Threads: torch's default (every core) unless ``--threads`` sets OMP_NUM_THREADS for the child.

Workloads (fp32):
* ``layer_norm+gelu``: x -> gelu(layer_norm(x)) -> gelu(layer_norm(.)) on (rows, 1024);
* ``rms_norm``: x * rsqrt(mean(x^2) + eps) * w on (rows, 1024);
* ``adam_update``: an Adam step written with torch in-place ops under ``no_grad`` over many
  parameters of assorted sizes (the ``foreach``-free loop users write; mutates its inputs);
* ``optim_adam``: ``torch.optim.Adam(foreach=True).step()`` over the same parameters (torch.optim's
  multi-tensor update, step counts as tensors; mutates its parameters and state);
* ``softmax``: ``torch.softmax(x, -1)`` on (rows, 1024), a single-kernel op.

Each workload runs in its own process with the three backends side by side, timed interleaved
(``--rounds`` rounds; each round times a few back-to-back calls of eager, then kiln, then
torch.compile) so that load from other processes on a shared machine hits all three alike. Reported:
us per call (median over rounds, and the minimum), speedup over eager, kiln's speed relative to
torch.compile (the ratio of medians), the CPU time per call (the process's, all threads; median over
rounds) and its ratio torch.compile / kiln (on a shared machine the steadier figure: wall time follows how
much of the cores other processes leave), compile seconds and the max error against eager.
Targets (CPU, default threads): kiln >= torch.compile on every workload.
"""

from __future__ import annotations

import argparse
import copy
import functools
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench import measure as M
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.report import (
    bar_chart,
    fmt,
    geomean_cell,
    machine_info,
    markdown_table,
    na,
    ratio,
    write_micro,
)

WORKLOADS = ("layer_norm+gelu", "rms_norm", "adam_update", "optim_adam", "softmax")


def layer_norm_gelu(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                    b2: torch.Tensor) -> torch.Tensor:
    h = F.gelu(F.layer_norm(x, x.shape[-1:], w1, b1))
    return F.gelu(F.layer_norm(h, h.shape[-1:], w2, b2))


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def adam_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                exp_avg_sqs: list[torch.Tensor]) -> None:
    lr, beta1, beta2, eps, step = 1e-3, 0.9, 0.999, 1e-8, 10
    bias1, bias2 = 1 - beta1**step, 1 - beta2**step
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v / bias2).sqrt().add_(eps)
            p.addcdiv_(m, denom, value=-lr / bias1)


class AdamState:
    """``torch.optim.Adam(foreach=True)`` over parameters with gradients, its state made by one eager step
    (the compiled steps are the steady ones). ``clone()`` copies parameters, gradients and state."""

    def __init__(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        self.params = [p.detach().clone().requires_grad_() for p in params]
        for p, g in zip(self.params, grads):
            p.grad = g.clone()
        self.opt = torch.optim.Adam(self.params, lr=1e-3, foreach=True)
        self.opt.step()

    def clone(self) -> AdamState:
        return copy.deepcopy(self)

    def tensors(self) -> list[torch.Tensor]:
        return [t.detach() for p in self.params for t in (p, *self.opt.state[p].values())]


def optim_adam(state: AdamState) -> None:
    state.opt.step()


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _sizes(n: int, seed: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    shapes: list[tuple[int, ...]] = []
    for i in range(n):  # a mix of matrices, vectors and scalars-ish, as in a real model
        a = int(torch.randint(16, 512, (1,), generator=g))
        shapes.append((a,) if i % 3 == 0 else (a, int(torch.randint(8, 256, (1,), generator=g))))
    return shapes


def make_inputs(workload: str, small: bool, device: str) -> tuple[Callable, list[Any], bool]:
    """(function, argument list, whether it mutates its inputs) with seeded data."""
    torch.manual_seed(0)
    rows = 256 if small else 4096
    d = 1024
    if workload == "layer_norm+gelu":
        return layer_norm_gelu, [torch.randn(rows, d, device=device)] + [
            torch.randn(d, device=device) for _ in range(4)], False
    if workload == "rms_norm":
        return rms_norm, [torch.randn(rows, d, device=device), torch.randn(d, device=device)], False
    if workload == "softmax":
        return softmax, [torch.randn(rows, d, device=device)], False
    shapes = _sizes(50 if small else 200, seed=1)
    lists = [[torch.randn(s, device=device) for s in shapes] for _ in range(3)]
    lists.append([torch.rand(s, device=device) for s in shapes])  # exp_avg_sq >= 0
    if workload == "optim_adam":
        return optim_adam, [AdamState(lists[0], lists[1])], True
    return adam_update, lists, True


def _clone(args: list[Any]) -> list[Any]:
    return [[t.clone() for t in a] if isinstance(a, list) else a.clone() for a in args]


def _result_tensors(fn: Callable, args: list[Any], mutates: bool) -> list[torch.Tensor]:
    out = fn(*args)
    if mutates:
        return [t for a in args for t in (a if isinstance(a, list) else a.tensors() if isinstance(a, AdamState)
                                          else [a])]
    return M.flatten_tensors(out)


def _compile_one(backend: str, fn: Callable, args: list[Any], mutates: bool, expected: list[torch.Tensor],
                 spec: B.CompileSpec, device: str) -> tuple[Callable | None, dict[str, Any]]:
    """Compile and run once (the first call compiles); the callable and its compile/accuracy figures."""
    try:
        run = B.compile_fn(backend, fn, spec)
        t0 = time.perf_counter()
        got = _result_tensors(run, args, mutates)
        M.sync(device)
        first = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - recorded as n/a
        print(B.error_details(exc))
        return None, {"error": B.short_error(exc)}
    err = M.compare([t.detach().cpu() for t in got], [t.cpu() for t in expected])
    return run, {"first_call_s": first, "max_abs": err.max_abs, "max_rel": err.max_rel,
                 "mismatch": err.count_mismatch}


def _cpu_s() -> float:
    """CPU seconds of this process, every thread (OpenMP's too): on a shared machine wall time depends on
    how much of the cores the other processes leave; the CPU a call burns much less."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(*, backends: list[str], workload: str, small: bool, device: str, calls: int,
            rounds: int, kiln_backend: str, tc_backend: str) -> dict[str, Any]:
    """Child process: one workload under every backend, timed interleaved round by round."""
    fn, args, mutates = make_inputs(workload, small, device)
    expected = [t.clone() for t in _result_tensors(fn, _clone(args), mutates)]
    spec = B.CompileSpec(kiln_backend=kiln_backend, tc_backend=tc_backend)
    runs: dict[str, tuple[Callable, list[Any]]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for backend in backends:
        own = _clone(args)  # each backend updates its own copy of a mutated state
        run, rows[backend] = _compile_one(backend, fn, own, mutates, expected, spec, device)
        if run is not None:
            runs[backend] = (run, own)
            if B.wait_tiered(backend) is not None:  # kiln's steady state: the C++ wrappers of hot graphs
                rows[backend]["tiers"] = B.settle_tiered(backend, functools.partial(run, *own))
    times: dict[str, list[float]] = {b: [] for b in runs}
    cpu: dict[str, list[float]] = {b: [] for b in runs}
    for _ in range(rounds):
        for backend, (run, own) in runs.items():
            c0 = _cpu_s()
            times[backend].append(M.us_per_call(functools.partial(run, *own), calls=calls, repeats=1))
            cpu[backend].append((_cpu_s() - c0) / calls * 1e6)
    for backend, ts in times.items():
        us = statistics.median(ts)
        rows[backend].update(us=us, us_min=min(ts), rounds=len(ts), cpu_us=statistics.median(cpu[backend]),
                             compile_s=max(0.0, rows[backend]["first_call_s"] - us * 1e-6))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"threads": torch.get_num_threads(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--workloads", type=cli.csv, default=list(WORKLOADS))
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per workload")
    args = cli.finish(p.parse_args(argv), "cpu_fused")
    if "eager" not in args.backends:
        args.backends = ["eager", *args.backends]
    info = machine_info(args.device, module="benchmarks.cpu_fused", threads=args.threads)
    results = []
    for workload in args.workloads:
        r = run_isolated("benchmarks.cpu_fused:measure",
                         dict(backends=args.backends, workload=workload, small=args.small,
                              device=args.device, calls=20 if args.small else 5, rounds=args.rounds,
                              kiln_backend=args.kiln_backend, tc_backend=args.tc_backend),
                         timeout_s=args.timeout, env=cli.child_env(args))
        rows = r.get("rows") or {b: {"error": r.get("error", "no result")} for b in args.backends}
        if r.get("threads"):
            info["cpu_threads"] = r["threads"]
        cells = []
        for backend in args.backends:
            row = dict(rows.get(backend, {"error": "not run"}), backend=backend, workload=workload)
            results.append(row)
            cells.append(f"{B.LABELS[backend]} " + (na(row["error"], 80) if row.get("error") else
                                                    f"{fmt(row['us'], 1)} us"))
        sp = _speedups(results, workload)
        print(f"{workload:<16} " + " | ".join(cells)
              + f" | kiln / torch.compile speed {fmt(sp['kiln_vs_tc'])}, CPU {fmt(sp['kiln_vs_tc_cpu'])}", flush=True)
    body = _table(results, args.workloads)
    why = _chart(args.out / "cpu_fused.png", results, args.workloads, info)
    md = write_micro(args.out, "cpu_fused", "Fused workloads: us per call and speedup over eager",
                     info, body + (f"\n\n({why})" if why else ""),
                     {"results": results, "small": args.small})
    print("\n" + md)
    return 0


def _speedups(results: list[dict], workload: str) -> dict[str, float | None]:
    rows = {r["backend"]: r for r in results if r["workload"] == workload}
    eager = rows.get("eager", {}).get("us")
    out = {b: ratio(eager, rows.get(b, {}).get("us")) for b in ("kiln", "torch_compile")}
    out["kiln_vs_tc"] = ratio(rows.get("torch_compile", {}).get("us"), rows.get("kiln", {}).get("us"))
    out["kiln_vs_tc_cpu"] = ratio(rows.get("torch_compile", {}).get("cpu_us"), rows.get("kiln", {}).get("cpu_us"))
    return out


def _table(results: list[dict], workloads: list[str]) -> str:
    headers = ["workload", "eager us", "kiln us", "torch.compile us", "kiln x", "torch.compile x",
               "kiln / tc speed", "min us (eager / kiln / tc)", "CPU us per call (kiln / tc)", "kiln / tc CPU",
               "compile s (kiln / tc)", "max rel err (kiln / tc)"]
    body: list[list[Any]] = []
    for w in workloads:
        rows = {r["backend"]: r for r in results if r["workload"] == w}
        e, k, t = (rows.get(b, {}) for b in ("eager", "kiln", "torch_compile"))
        sp = _speedups(results, w)

        def cell(r: dict, key: str, digits: int = 1) -> str:
            return na(r["error"]) if r.get("error") else fmt(r.get(key), digits)

        body.append([w, cell(e, "us"), cell(k, "us"), cell(t, "us"), fmt(sp["kiln"]),
                     fmt(sp["torch_compile"]), fmt(sp["kiln_vs_tc"]),
                     " / ".join(fmt(r.get("us_min"), 1) for r in (e, k, t)),
                     f"{fmt(k.get('cpu_us'), 1)} / {fmt(t.get('cpu_us'), 1)}", fmt(sp["kiln_vs_tc_cpu"]),
                     f"{fmt(k.get('compile_s'))} / {fmt(t.get('compile_s'))}",
                     f"{fmt(k.get('max_rel'))} / {fmt(t.get('max_rel'))}"])
    sps = [_speedups(results, w) for w in workloads]
    body.append(["**geomean**", "", "", "", geomean_cell([s["kiln"] for s in sps]),
                 geomean_cell([s["torch_compile"] for s in sps]),
                 geomean_cell([s["kiln_vs_tc"] for s in sps]), "", "", geomean_cell([s["kiln_vs_tc_cpu"] for s in sps]),
                 "", ""])
    return markdown_table(headers, body)


def _chart(path: Path, results: list[dict], workloads: list[str], info: dict) -> str | None:
    items = []
    for w in workloads:
        sp = _speedups(results, w)
        items.append((w, {"kiln": sp["kiln"], "torch.compile": sp["torch_compile"]}))
    where = info.get("gpu") or "CPU"
    return bar_chart(path, {"fused workloads": items}, f"speedup over eager on {where}")


if __name__ == "__main__":
    sys.exit(main())
