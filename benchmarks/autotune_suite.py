"""kiln default vs kiln max-autotune-no-cudagraphs on suite models (issue 8), inference.

    uv run python -m benchmarks.autotune_suite [--models gpt2,bert_base] [--small] [--iters 30]
                                                [--budget-s 1800] [--in-process]

For each model (benchmarks/kiln_bench/models.py; bf16 ``eval()`` on GPU, fp32 on CPU), in its own
process with fresh compile caches: compile with ``kiln.compile(model)`` and with
``kiln.compile(model, mode="max-autotune-no-cudagraphs")``, time each (median of ``--iters`` calls
after warm-up, taken in alternating rounds so host-speed drift hits both alike), and print one
table: both times, the ratio (default / max-autotune: above 1 means max-autotune is faster),
max-autotune's compile time, how many matmuls took a Triton template vs stayed on cuBLAS (from the
``perf_hints`` log), and the largest difference from eager. A geomean of the ratios closes the
table. A model that fails shows its error in its row; models not started
within ``--budget-s`` are listed as skipped.

``--cross-compile cuda:90`` (no GPU needed): each model is compiled for CUDA with fake inputs and
every max-autotune candidate compiled for that target (nothing timed): the table gives the tuning
sites, distinct problems (identical layers count once), candidates, compiles and the compile-only
seconds. ``--autotune-budget-s`` sets KILN_AUTOTUNE_BUDGET_S for every compile.

On CPU max-autotune has nothing to tune (matmul templates and kernel configurations are tuned on a
CUDA device), which the script says; the table is still printed (``--small`` for a quick run).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

MODE = "max-autotune-no-cudagraphs"


class _Counter(logging.Handler):
    """Counts max-autotune's per-matmul decisions in the perf_hints log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.template = 0
        self.cublas = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "runs as Triton template" in msg:
            self.template += 1
        elif "stays a cuBLAS extern" in msg:
            self.cublas += 1


def _first_tensor(out: Any) -> torch.Tensor:
    from benchmarks.kiln_bench.models import logits_of

    return logits_of(out)


def measure_model(name: str, small: bool, device: str, iters: int, mode: str = MODE) -> dict[str, Any]:
    """Both modes for one model in this process (run in a child by ``main``)."""
    import kiln
    from benchmarks.kiln_bench.measure import timed_call
    from benchmarks.kiln_bench.models import build_for_mode

    dev = torch.device(device)
    case = build_for_mode(name, small=small, device=dev, training=False)
    model, args, kwargs = case.model, case.args, case.kwargs
    with torch.no_grad():
        ref = _first_tensor(model(*args, **kwargs)).float()
    row: dict[str, Any] = {"model": name, "mode": mode}
    tuned_mode = mode
    counter = _Counter()
    reports = _Reports()
    hints = logging.getLogger("kiln.perf_hints")
    steps = {}
    kiln.reset()
    for mode in ("default", tuned_mode):  # each kiln.compile wrapper keeps its own compiled entries
        compiled = kiln.compile(model, mode=None if mode == "default" else mode)
        if mode == tuned_mode:
            hints.addHandler(counter)
            hints.addHandler(reports)
            hints.setLevel(logging.INFO)
        try:
            with torch.no_grad():
                compile_s, out = timed_call(lambda: compiled(*args, **kwargs), dev)  # noqa: B023
                for _ in range(3):
                    compiled(*args, **kwargs)
        finally:
            hints.removeHandler(counter)
            hints.removeHandler(reports)
        steps[mode] = lambda c=compiled: c(*args, **kwargs)
        key = "tuned" if mode == tuned_mode else mode
        row[f"{key}_compile_s"] = compile_s
        row[f"{key}_diff"] = float((_first_tensor(out).float() - ref).abs().max())
    # alternating rounds (default, max-autotune, default, ...): the GPU host's speed drifts within a
    # process, and host-bound steps with it (benchmarks/host_drift.py)
    rounds = 5
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    with torch.no_grad():
        for _ in range(rounds):
            for mode, step in steps.items():
                times[mode].extend(timed_call(step, dev)[0] for _ in range(max(1, iters // rounds)))
    for mode, ts in times.items():
        row[f"{'tuned' if mode == tuned_mode else mode}_ms"] = 1e3 * statistics.median(ts)
    row["templates"], row["cublas"] = counter.template, counter.cublas
    row.update(_report_totals(reports.reports))
    return row


def _report_totals(reports: list[Any]) -> dict[str, Any]:
    """Sums of max-autotune's per-compile reports (autotune/session.py TuningReport)."""
    return {
        "problems": sum(r.problems for r in reports), "sites": sum(r.sites for r in reports),
        "candidates": sum(r.candidates for r in reports), "jobs": sum(r.compile.jobs for r in reports),
        "failed": sum(r.compile.failed for r in reports), "skipped": sum(r.compile.skipped for r in reports),
        "tune_compile_s": sum(r.compile.seconds for r in reports), "timing_s": sum(r.timing_s for r in reports),
        "timed": sum(r.timed_candidates for r in reports), "budget_defaults": sum(r.budget_defaults for r in reports),
        "workers": max([r.compile.workers for r in reports] or [0]),
        "matmul_problems": sum(r.kinds.get("matmul", 0) for r in reports),
        "kernel_problems": sum(r.kinds.get("kernel", 0) for r in reports),
        # per-compile seconds summed over jobs (cross-compiles measure each): templates vs the rest
        "template_jobs": sum(1 for r in reports for _, lbl in r.compile.job_seconds if lbl.startswith("tmpl_")),
        "template_job_s": sum(t for r in reports for t, lbl in r.compile.job_seconds if lbl.startswith("tmpl_")),
        "other_jobs": sum(1 for r in reports for _, lbl in r.compile.job_seconds if not lbl.startswith("tmpl_")),
        "other_job_s": sum(t for r in reports for t, lbl in r.compile.job_seconds if not lbl.startswith("tmpl_")),
    }


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(rows: list[dict[str, Any]], device: str) -> None:
    from benchmarks.kiln_bench.measure import geomean

    head = (f"{'model':<24} {'default ms':>11} {'autotune ms':>12} {'ratio':>7} {'compile s':>10} "
            f"{'mm: tmpl/cuBLAS':>16} {'max|d| eager':>13}  tuning: problems, compiled (s), timed (s), budget cut")
    mode = next((r["mode"] for r in rows if "mode" in r), MODE)
    print(f"\nkiln default vs kiln {mode} ({device}); ratio = default / autotune (>1: autotune faster)")
    print(head)
    print("-" * len(head))
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<24} {'':>11} {'':>12} {'':>7} {'':>10} {'':>16} {'':>13}  {r['error'][:160]}")
            continue
        d, a = r["default_ms"], r["tuned_ms"]
        ratio = d / a if a > 0 else None
        if ratio:
            ratios.append(ratio)
        mm = f"{r['templates']}/{r['cublas']}"
        diff = max(r["default_diff"], r["tuned_diff"])
        tuning = (f"{r.get('problems', '-')} of {r.get('sites', '-')} sites, {r.get('jobs', '-')} "
                  f"({_fmt(r.get('tune_compile_s'), '.1f')}), {r.get('timed', '-')} ({_fmt(r.get('timing_s'), '.1f')}), "
                  f"{r.get('budget_defaults', '-')}")
        print(f"{r['model']:<24} {_fmt(d, '11.3f')} {_fmt(a, '12.3f')} {_fmt(ratio, '7.3f')} "
              f"{_fmt(r['tuned_compile_s'], '10.1f')} {mm:>16} {_fmt(diff, '13.4f')}  {tuning}")
    g = geomean(ratios)
    print(f"{'geomean':<24} {'':>11} {'':>12} {_fmt(g, '7.3f')}   ({len(ratios)} of {len(rows)} models)")


# ---- cross-compile: what max-autotune would compile, measured on a host without a GPU ----

class _Reports(logging.Handler):
    """Collects max-autotune's per-compile TuningReport (attached to its summary log record)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reports: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "kiln_autotune_report", None)
        if report is not None:
            self.reports.append(report)


def _cuda_device_constants(gm: Any) -> None:
    """The captured graph was traced on CPU: device arguments (``arange(..., device=cpu)``) become CUDA."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def fix(v: Any) -> Any:
        if isinstance(v, torch.device) and v == cpu:
            return cuda
        if isinstance(v, str) and v == "cpu":
            return "cuda"
        return v

    for n in gm.graph.nodes:
        if n.op == "call_function" or n.op == "call_method":
            n.args = tuple(fix(a) for a in n.args)
            n.kwargs = {k: fix(v) for k, v in n.kwargs.items()}
    gm.recompile()


def cross_compile_model(name: str, small: bool, target: str) -> dict[str, Any]:
    """Compile ``name`` for CUDA with fake inputs under max-autotune on this (GPU-less) host: every
    candidate is compiled for ``target`` (KILN_AUTOTUNE_CROSS_TARGET) and nothing is timed. Returns
    the candidate counts and the compile-only seconds (run in a child: the knob is read at import)."""
    os.environ["KILN_AUTOTUNE_CROSS_TARGET"] = target  # read when kiln.inductor is first imported
    from torch._subclasses.fake_tensor import FakeTensorMode

    import kiln
    from benchmarks.kiln_bench.models import build
    from kiln.backends import resolve_backend
    from kiln.settings import CompileOptions

    case = build(name, small=small, device="cpu")
    case.model.eval().to(torch.bfloat16)  # as the GPU suite runs inference
    graphs: list[tuple[Any, list[Any]]] = []

    class Captured(Exception):
        pass

    def record(gm: Any, example_inputs: Any) -> Any:
        graphs.append((gm, list(example_inputs)))

        def stop(*a: Any) -> Any:
            raise Captured
        return stop

    kiln.reset()
    try:
        with torch.no_grad():
            kiln.compile(case.model, backend=record)(*case.args, **case.kwargs)
    except Captured:
        pass
    reports = _Reports()
    hints = logging.getLogger("kiln.perf_hints")
    hints.addHandler(reports)
    hints.setLevel(logging.INFO)
    from kiln.inductor.autotune import AutotuneOptions

    at = AutotuneOptions(cross_target=target)  # explicit: the knob is read only at kiln.inductor's import
    backend = resolve_backend("inductor", CompileOptions(mode=MODE, options={"autotune": at}))
    t0 = time.perf_counter()
    try:
        for gm, inputs in graphs:
            _cuda_device_constants(gm)
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake = [mode.from_tensor(x).to("cuda") if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                backend(gm, fake)
    finally:
        hints.removeHandler(reports)
    total = time.perf_counter() - t0
    row: dict[str, Any] = {"model": name, "graphs": len(graphs), "compile_s": total, "target": target}
    row.update(_report_totals(reports.reports))
    return row


def print_cross_table(rows: list[dict[str, Any]], target: str) -> None:
    head = (f"{'model':<24} {'graphs':>6} {'sites':>6} {'problems mm/kern':>17} {'candidates':>10} "
            f"{'compiled':>8} {'failed':>6} {'workers':>7} {'compile-only s':>14} {'whole compile s':>15}  note")
    print(f"\nmax-autotune cross-compile for {target} (no GPU: every candidate compiled, nothing timed)")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<24} {'':>6} {'':>6} {'':>17} {'':>10} {'':>8} {'':>6} {'':>7} {'':>14} {'':>15}  "
                  f"{r['error'][:160]}")
            continue
        probs = f"{r['problems']} ({r['matmul_problems']}/{r['kernel_problems']})"
        print(f"{r['model']:<24} {r['graphs']:>6} {r['sites']:>6} {probs:>17} {r['candidates']:>10} "
              f"{r['jobs']:>8} {r['failed']:>6} {r['workers']:>7} {_fmt(r['tune_compile_s'], '14.1f')} "
              f"{_fmt(r['compile_s'], '15.1f')}  {'skipped ' + str(r['skipped']) if r['skipped'] else ''}")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.kiln_bench.models import SUITE

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(SUITE), help="comma-separated suite model names")
    p.add_argument("--small", action="store_true", help="tiny configs of the same architectures")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=1800.0, help="stop starting models after this")
    p.add_argument("--model-timeout-s", type=float, default=900.0)
    p.add_argument("--in-process", action="store_true", help="no child processes (debugging)")
    p.add_argument("--mode", default=MODE, choices=[MODE, "max-autotune"],
                   help="the tuned mode compared with default (max-autotune adds CUDA graphs, as torch's does)")
    p.add_argument("--autotune-budget-s", type=float, default=None,
                   help="KILN_AUTOTUNE_BUDGET_S for each compile (default: kiln's, 60 s)")
    p.add_argument("--cross-compile", metavar="TARGET", default="",
                   help="no GPU needed: compile every max-autotune candidate for TARGET (e.g. cuda:90) "
                        "with fake CUDA inputs and report counts and compile-only time; nothing is timed")
    a = p.parse_args(argv)
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(SUITE)}")
    env = {"KILN_AUTOTUNE_BUDGET_S": str(a.autotune_budget_s)} if a.autotune_budget_s is not None else {}
    if a.cross_compile:
        env["KILN_AUTOTUNE_CROSS_TARGET"] = a.cross_compile
    if a.device == "cpu" and not a.cross_compile:
        print(f"note: on CPU {MODE} has nothing to tune (matmul templates and Triton kernel configurations "
              "are tuned on a CUDA device): both columns run the same C++ kernels.")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in names:
        left = a.budget_s - (time.perf_counter() - t0)
        if left <= 0:
            rows.append({"model": name, "error": f"skipped: time budget of {a.budget_s:.0f}s spent"})
            continue
        kwargs: dict[str, Any] = {"name": name, "small": a.small, "device": a.device, "iters": a.iters,
                                  "mode": a.mode}
        target = "benchmarks.autotune_suite:measure_model"
        if a.cross_compile:
            kwargs, target = {"name": name, "small": a.small, "target": a.cross_compile}, (
                "benchmarks.autotune_suite:cross_compile_model")
        print(f"[{time.perf_counter() - t0:7.1f}s] {name} ...", file=sys.stderr, flush=True)
        if a.in_process:
            try:
                os.environ.update(env)
                row = (cross_compile_model if a.cross_compile else measure_model)(**kwargs)
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
                row = {"model": name, "error": f"{type(e).__name__}: {e}".replace("\n", " | ")}
        else:
            from benchmarks.kiln_bench.isolate import run_isolated

            row = run_isolated(target, kwargs, timeout_s=min(a.model_timeout_s, max(60.0, left)), env=env)
            row.setdefault("model", name)
            if "error" in row:
                row["error"] = str(row["error"]).replace("\n", " | ")[-300:]
        rows.append(row)
    if a.cross_compile:
        print_cross_table(rows, a.cross_compile)
    else:
        print_table(rows, a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
