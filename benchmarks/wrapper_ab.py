"""kiln's Python wrapper against its tiered wrapper (the C++ wrapper built in the background), with
torch.compile beside them, on suite models: one process per model, interleaved timed rounds.

    python -m benchmarks.wrapper_ab --device cuda --models resnet50,llama_350m [--variants python,tiered,torch_compile]
    python -m benchmarks.wrapper_ab --device cuda --training --models gpt2,llama_350m

Each variant compiles its own copy of the model (same weights; inference as the suite runs it: bf16 on CUDA,
fp32 on CPU, ``no_grad``; with ``--training``, the suite's training step: AMP bf16 on CUDA, forward, loss,
backward, and each variant's peak memory over one step above what was allocated before it). Before timing: every variant warms up, kiln's tiered graphs are waited for
(``kiln.inductor.wait_tiered``) and their trial is run out (the calls that alternate the two wrappers once
the library is loaded), so the tiered column times the wrapper each graph settled on, reported beside it.
Then ``--rounds`` rounds, each timing ``--iters`` steps of every variant in turn (synchronised per step
on CUDA); the table gives the median of the per-round medians, and each variant's speed against the
Python wrapper and against torch.compile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.models import build_for_mode
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro
from benchmarks.kiln_bench.suite_worker import _step_fn

VARIANTS = {"python": ("kiln", {"wrapper": "python"}), "tiered": ("kiln", {"wrapper": "tiered"}),
            "cpp": ("kiln", {"wrapper": "cpp"}), "torch_compile": ("torch_compile", {}), "eager": ("eager", {})}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_step_s(step: Any, device: torch.device, iters: int) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _step_peak_bytes(step: Any, device: torch.device) -> int | None:
    """Bytes allocated at the peak of one step above those allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    _sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def measure(*, name: str, variants: list[str], device: str, small: bool, iters: int, rounds: int,
            training: bool = False) -> dict[str, Any]:
    """Child: every variant of one model in this process, interleaved rounds."""
    from kiln.inductor.tiered import live_tiered

    dev = torch.device(device)
    steps: dict[str, Any] = {}
    result: dict[str, Any] = {}
    for v in variants:
        backend, options = VARIANTS[v]
        torch.manual_seed(0)
        case = build_for_mode(name, small=small, device=dev, training=training)
        before = {id(c) for c in live_tiered()}
        try:
            spec = B.CompileSpec(kiln_options=tuple(sorted(options.items())))
            step = _step_fn(case, B.compile_fn(backend, case.model, spec), training, dev)
            t0 = time.perf_counter()
            step()
            _sync(dev)
            result[v] = {"first_s": time.perf_counter() - t0}
            for _ in range(3):
                step()
            if v == "tiered":
                result[v]["tier_wait_s"] = B.wait_tiered("kiln")
                result[v]["tiers"] = B.settle_tiered("kiln", step, exclude=frozenset(before))
            result[v]["peak_bytes"] = _step_peak_bytes(step, dev)
        except Exception as exc:  # noqa: BLE001 - the row records the failure
            print(B.error_details(exc))
            result[v] = {"error": B.short_error(exc)}
            continue
        steps[v] = step
    per_round: dict[str, list[float]] = {v: [] for v in steps}
    for _ in range(rounds):
        for v, step in steps.items():
            per_round[v].append(_median_step_s(step, dev, iters))
    for v, ms in per_round.items():
        result[v]["ms"] = statistics.median(ms) * 1e3
        result[v]["rounds_ms"] = [round(m * 1e3, 4) for m in ms]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p, backends=False)
    p.add_argument("--models", type=cli.csv, default=["resnet50", "llama_350m"])
    p.add_argument("--variants", type=cli.csv, default=["python", "tiered", "torch_compile"],
                   help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--training", action="store_true", help="time the suite's training step instead of inference")
    args = cli.finish(p.parse_args(argv), "wrapper_ab")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; use {', '.join(VARIANTS)}")
    small = args.small or not args.device.startswith("cuda")
    info = machine_info(args.device, module="benchmarks.wrapper_ab", threads=args.threads)
    rows, payload = [], {}
    for name in args.models:
        res = run_isolated("benchmarks.wrapper_ab:measure",
                           dict(name=name, variants=args.variants, device=args.device, small=small,
                                iters=args.iters, rounds=args.rounds, training=args.training),
                           timeout_s=args.timeout, env=cli.child_env(args))
        print(name, res, flush=True)
        payload[name] = res
        if "error" in res and not isinstance(res.get("error"), dict):
            rows.append([name, "all", na(res["error"])] + ["n/a"] * 5)
            continue
        base, tc = res.get("python", {}).get("ms"), res.get("torch_compile", {}).get("ms")
        for v in args.variants:
            r = res.get(v, {})
            if "error" in r:
                rows.append([name, v, na(r["error"])] + ["n/a"] * 5)
                continue
            settled = r.get("tiers")
            rows.append([name, v, fmt(r.get("ms"), 3), fmt(ratio(base, r.get("ms"))), fmt(ratio(tc, r.get("ms"))),
                         f"{r['tier_wait_s']:.1f} s, {settled}" if settled is not None else "-", fmt(r.get("first_s")),
                         fmt(r["peak_bytes"] / 2**20, 1) if r.get("peak_bytes") is not None else "-"])
    body = (f"{'Training (AMP bf16 on CUDA)' if args.training else 'Inference'}, {'tiny' if small else 'suite'} configs, one process per model, variants interleaved "
            f"({args.rounds} rounds of {args.iters} steps; median of the round medians).\n\n"
            + markdown_table(["model", "variant", "ms", "speed vs python wrapper", "speed vs torch.compile",
                              "tiered: built after, graphs per wrapper", "first call s", "step peak MiB"], rows))
    print(write_micro(args.out, "wrapper_ab_train" if args.training else "wrapper_ab", "kiln's Python wrapper vs its tiered wrapper", info, body, payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
