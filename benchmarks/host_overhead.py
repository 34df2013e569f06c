"""Micro-benchmark: host cost of one compiled call (issues 24 and 20), kiln vs torch.compile vs eager.

    uv run python -m benchmarks.host_overhead [--device cpu] [--layers 4] [--calls 50] [--repeats 5]
        [--backends eager,kiln,torch.compile] [--cases static,dynamic] [--kiln-options '{"wrapper": "cpp"}']

A small Llama-like block stack (RMSNorm, q/k/v/o projections, RoPE, causal SDPA, SiLU-gated MLP; no
HF model) on tiny shapes (batch 2 x seq 8 x width 64, fp32), where the kernels cost almost nothing, so a
call's wall time is its host time: the wrapper, the guard check, the kernel launches and the extern
calls. Cases: ``static`` (one size) and ``dynamic`` (``dynamic=True`` for both compilers; each compiled
once, then timed at seq 8 and at seq 13). Per backend and case it prints:

- ``us/call``: the minimum over ``--repeats`` of the mean of ``--calls`` back-to-back calls (no_grad;
  synchronised once per batch of calls on a GPU), the backends interleaved so drift hits all alike;
  ``cpu us/call`` the same in this thread's CPU time (``time.thread_time``), which a loaded shared host
  disturbs far less than wall time (on the CPU with one thread it is the host cost);
- ``aten ops/call``: the ATen operators one call dispatches from Python (the profiler's top-level ``aten::``
  events; views and allocations included), with the most frequent ones;
- ``py calls/call``: Python-level calls one call makes (``sys.setprofile``: Python functions and C
  functions such as ``torch.mm``, ``Tensor.as_strided``, ``data_ptr`` and the ctypes kernel calls).

Results are also compared with eager (max abs difference) for each size.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = self.n1(x)
        q, k, v = (p(y).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        q = q * cos + _rotate(q) * sin
        k = k * cos + _rotate(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class TinyLlama(nn.Module):
    """A Llama-like decoder stack without embeddings (the input is the hidden state)."""

    def __init__(self, layers: int = 4, d: int = 64, heads: int = 4, ff: int = 128) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.head_dim = d // heads
        self.norm = RMSNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], dtype=torch.float32, device=x.device)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device)
                               / self.head_dim))
        f = torch.outer(pos, inv)
        e = torch.cat((f, f), -1)
        cos, sin = e.cos(), e.sin()
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.norm(x)


def count_aten_ops(fn: Callable[[], Any]) -> collections.Counter[str]:
    """ATen operators one call of ``fn`` dispatches from Python, by name: the profiler's top-level
    ``aten::`` events (an op's own inner calls, as mm's allocation of its result, are not counted).
    The profiler, unlike a dispatch mode, leaves the compilers' cached code in use."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ops: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops[e.name] += 1
    return ops


def count_python_calls(fn: Callable[[], Any]) -> int:
    """Python and C function calls one call of ``fn`` makes (the profiler hook sees both)."""
    n = 0

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n - 1  # the setprofile(None) call itself


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _compile(backend: str, model: nn.Module, dynamic: bool, kiln_options: dict[str, Any]) -> Any:
    if backend == "eager":
        return model
    if backend == "kiln":
        import kiln
        return kiln.compile(model, dynamic=True if dynamic else None, options=kiln_options or None)
    return torch.compile(model, dynamic=True if dynamic else None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    device = args.device
    model = TinyLlama(layers=args.layers).to(device).eval()
    backends = args.backends.split(",")
    results: dict[str, Any] = {}
    for case in args.cases.split(","):
        sizes = [8] if case == "static" else [8, 13]
        compiled = {b: _compile(b, model, case == "dynamic", args.kiln_options) for b in backends}
        for seq in sizes:
            x = torch.randn(2, seq, 64, device=device)
            with torch.no_grad():
                want = model(x)
                diffs = {b: float((c(x) - want).abs().max()) for b, c in compiled.items()}
                for c in compiled.values():  # warm: compiles, first-call work
                    for _ in range(3):
                        c(x)
                calls: dict[str, Callable[[], Any]] = {b: (lambda c=c, x=x: c(x)) for b, c in compiled.items()}
                best = {b: math.inf for b in backends}
                best_cpu = {b: math.inf for b in backends}
                for _ in range(args.repeats):
                    for b, fn in calls.items():
                        _sync(device)
                        t0, c0 = time.perf_counter(), time.thread_time()
                        for _ in range(args.calls):
                            fn()
                        _sync(device)
                        best[b] = min(best[b], (time.perf_counter() - t0) / args.calls * 1e6)
                        best_cpu[b] = min(best_cpu[b], (time.thread_time() - c0) / args.calls * 1e6)
                for b, fn in calls.items():
                    ops = count_aten_ops(fn)
                    row = {"us_per_call": best[b], "cpu_us_per_call": best_cpu[b], "aten_ops": sum(ops.values()),
                           "top_ops": dict(ops.most_common(6)), "py_calls": count_python_calls(fn),
                           "max_abs_diff": diffs[b]}
                    results[f"{case} seq={seq} {b}"] = row
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (1: host cost, not OpenMP)")
    p.add_argument("--backends", default="eager,kiln,torch.compile")
    p.add_argument("--cases", default="static,dynamic")
    p.add_argument("--kiln-options", type=json.loads, default={})
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    results = run(args)
    print(f"{'case':<28} {'us/call':>9} {'cpu us':>9} {'aten ops':>9} {'py calls':>9} {'max|diff|':>10}  top ops")
    for name, r in results.items():
        top = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in r["top_ops"].items())
        print(f"{name:<28} {r['us_per_call']:9.1f} {r['cpu_us_per_call']:9.1f} {r['aten_ops']:9d} {r['py_calls']:9d} "
              f"{r['max_abs_diff']:10.2e}  {top}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
