"""Model-suite benchmark: eager vs kiln vs torch.compile in one run.

    uv run python -m benchmarks.run --small --device cpu --models gpt2,bert_base --modes inference

Each (model, mode) runs in fresh processes: eager and torch.compile share one (eager first, it is the
accuracy reference), kiln gets its own, each with empty compile caches, so a crash, OOM or hang in
one compiler cannot take the other's numbers down. Writes ``suite.md``, ``suite.json`` and
``suite_speedup.png`` into ``--out``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/run.py` also works
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kiln_bench import cli, suite_report
from benchmarks.kiln_bench.backends import LABELS
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.models import SUITE
from benchmarks.kiln_bench.report import fmt, machine_info, write_json

MODES = ("inference", "training")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=cli.csv, default=list(SUITE),
                   help=f"comma list from {','.join(SUITE)} (default: all)")
    p.add_argument("--modes", type=cli.csv, default=list(MODES), help="inference,training")
    p.add_argument("--iters", type=int, default=None,
                   help="timed steps per row (default: 20 on GPU, 10 on CPU)")
    p.add_argument("--warmup", type=int, default=3, help="calls before timing (incl. the first)")
    p.add_argument("--compile-mode", default=None,
                   help="mode for both compilers: default|reduce-overhead|max-autotune")
    p.add_argument("--explain", action="store_true",
                   help="graph breaks of torch.compile from torch._dynamo.explain (re-traces); "
                        "default: its counters")
    p.add_argument("--isolate-kiln", action="store_true",
                   help="run kiln's row in its own process (default: one process per model and mode, "
                        "backends timed in alternating rounds so host drift hits all alike)")
    p.add_argument("--dynamic", action="store_true",
                   help="also compile with dynamic=True (kiln and torch.compile, one more process per "
                        "model and mode) and report each compiler's dynamic geomean against its static one")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting new rows after this many seconds (rows left are "
                        "reported as not run)")
    cli.add_common(p)
    args = cli.finish(p.parse_args(argv), "suite")
    bad = [m for m in args.models if m not in SUITE] + [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"unknown model/mode {bad}")
    if args.iters is None:
        args.iters = 20 if args.device.startswith("cuda") else 10
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[str], bool]]:
    """(model, mode, backends of one child process, dynamic=True), inference first (cheaper). Eager
    first (the reference), then kiln, then torch.compile; with ``--dynamic``, the compilers again with
    dynamic=True in a process of their own (a second compile of the same module in one process could
    meet the first one's cache entries)."""
    order = sorted(args.backends, key=["eager", "kiln", "torch_compile"].index)
    groups = ([[b for b in order if b != "kiln"], [b for b in order if b == "kiln"]]
              if args.isolate_kiln else [order])
    runs = [(g, False) for g in groups if g]
    if args.dynamic:
        runs.append(([b for b in order if b != "eager"], True))
    return [(model, mode, g, dyn) for mode in args.modes for model in args.models for g, dyn in runs if g]


def describe(row: dict[str, Any], eager_ms: float | None) -> str:
    label = f"{row['model']:<22} {row['mode']:<9} {LABELS.get(row['backend'], row['backend']):<13}"
    if row.get("error"):
        return f"{label} n/a ({row['error'][:160]})"
    sp = "" if eager_ms is None or row["backend"] == "eager" else \
        f" ({eager_ms / row['median_ms']:.2f}x eager)"
    return (f"{label} {fmt(row['median_ms'])} ms{sp}, first call {fmt(row['first_call_s'])} s, "
            f"peak {fmt(row.get('peak_mb'), 1)} MB")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    info = machine_info(args.device, module="benchmarks.run", threads=args.threads)
    settings = {"device": args.device, "small": args.small, "iters": args.iters,
                "warmup": args.warmup, "kiln_backend": args.kiln_backend,
                "tc_backend": args.tc_backend, "compile_mode": args.compile_mode, "dynamic": args.dynamic,
                "kiln_options": args.kiln_options}
    print(f"suite: {len(args.models)} models x {args.modes} x {args.backends} on {args.device}"
          f" -> {args.out}", flush=True)
    rows: list[dict[str, Any]] = []
    eager_ms: dict[tuple[str, str], float] = {}
    t_start = time.perf_counter()
    (args.out / "logs").mkdir(exist_ok=True)
    for model, mode, group, dynamic in plan(args):
        elapsed = time.perf_counter() - t_start
        if args.budget_s is not None and elapsed > args.budget_s:
            for b in group:
                rows.append({"model": model, "mode": mode, "backend": b, "error":
                             f"not run: suite budget of {args.budget_s:.0f}s used up"})
            print(f"{model:<22} {mode:<9} {','.join(group)}: skipped (budget)", flush=True)
            continue
        timeout = args.timeout if args.budget_s is None else \
            max(60.0, min(args.timeout, args.budget_s - elapsed + 60))
        kwargs = dict(model=model, mode=mode, backends=group, device=args.device,
                      small=args.small, iters=args.iters, warmup=args.warmup,
                      kiln_backend=args.kiln_backend, tc_backend=args.tc_backend,
                      compile_mode=args.compile_mode, explain=args.explain, dynamic=dynamic,
                      kiln_options=args.kiln_options)
        log = args.out / "logs" / f"{model}-{mode}-{'-'.join(group)}{'-dynamic' if dynamic else ''}.log"
        result = run_isolated("benchmarks.kiln_bench.suite_worker:measure_rows", kwargs,
                              timeout_s=timeout, log_path=log, env=cli.child_env(args))
        new = result.get("rows") or [
            {"model": model, "mode": mode, "backend": suite_report.row_backend(b, dynamic),
             "error": result.get("error", "?")} for b in group]
        for r in new:
            r["child_wall_s"] = result.get("child_wall_s")
            if r["backend"] == "eager" and r.get("median_ms"):
                eager_ms[(model, mode)] = r["median_ms"]
            print(describe(r, eager_ms.get((model, mode))), flush=True)
        rows.extend(new)
        _write(args, rows, info, settings, chart=False)
    _write(args, rows, info, settings, chart=True)
    print(f"\nwrote {args.out}/suite.md, suite.json, suite_speedup.png "
          f"({time.perf_counter() - t_start:.0f} s)")
    return 0


def _write(args: argparse.Namespace, rows: list[dict], info: dict, settings: dict,
           chart: bool) -> None:
    md = suite_report.markdown(rows, info, settings)
    if chart:
        why = suite_report.chart(args.out / "suite_speedup.png", rows,
                                 f"speedup over eager on {info.get('gpu') or 'CPU'}")
        if why:
            md += f"\n({why})\n"
        print("\n" + md)
    (args.out / "suite.md").write_text(md)
    write_json(args.out / "suite.json", {"meta": info, "settings": settings, "rows": rows,
                                         "geomean": suite_report.geomeans(rows)})


if __name__ == "__main__":
    sys.exit(main())
