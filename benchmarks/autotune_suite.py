"""kiln default vs kiln max-autotune-no-cudagraphs on suite models (issue 8), inference.

    uv run python -m benchmarks.autotune_suite [--models gpt2,bert_base] [--small] [--iters 30]
                                                [--budget-s 1800] [--in-process]

For each model (benchmarks/kiln_bench/models.py; bf16 ``eval()`` on GPU, fp32 on CPU), in its own
process with fresh compile caches: compile with ``kiln.compile(model)`` and with
``kiln.compile(model, mode="max-autotune-no-cudagraphs")``, time each (median of ``--iters`` calls,
after warm-up), and print one table: both times, the ratio (default / max-autotune: above 1 means
max-autotune is faster), max-autotune's compile time, how many matmuls took a Triton template vs
stayed on cuBLAS (from the ``perf_hints`` log), and the largest difference from eager. A geomean of
the ratios closes the table. A model that fails shows its error in its row; models not started
within ``--budget-s`` are listed as skipped.

On CPU max-autotune has nothing to tune (matmul templates and kernel configurations are tuned on a
CUDA device), which the script says; the table is still printed (``--small`` for a quick run).
"""

from __future__ import annotations

import argparse
import logging
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


def measure_model(name: str, small: bool, device: str, iters: int) -> dict[str, Any]:
    """Both modes for one model in this process (run in a child by ``main``)."""
    import kiln
    from benchmarks.kiln_bench.measure import median_seconds, timed_call
    from benchmarks.kiln_bench.models import build_for_mode

    dev = torch.device(device)
    case = build_for_mode(name, small=small, device=dev, training=False)
    model, args, kwargs = case.model, case.args, case.kwargs
    with torch.no_grad():
        ref = _first_tensor(model(*args, **kwargs)).float()
    row: dict[str, Any] = {"model": name}
    counter = _Counter()
    hints = logging.getLogger("kiln.perf_hints")
    for mode in ("default", MODE):
        kiln.reset()
        compiled = kiln.compile(model, mode=None if mode == "default" else mode)
        if mode == MODE:
            hints.addHandler(counter)
            hints.setLevel(logging.INFO)
        try:
            with torch.no_grad():
                compile_s, out = timed_call(lambda: compiled(*args, **kwargs), dev)  # noqa: B023
                for _ in range(3):
                    compiled(*args, **kwargs)
                ms = 1e3 * median_seconds(lambda: compiled(*args, **kwargs), dev, iters)  # noqa: B023
        finally:
            hints.removeHandler(counter)
        row[f"{mode}_ms"] = ms
        row[f"{mode}_compile_s"] = compile_s
        row[f"{mode}_diff"] = float((_first_tensor(out).float() - ref).abs().max())
    row["templates"], row["cublas"] = counter.template, counter.cublas
    return row


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(rows: list[dict[str, Any]], device: str) -> None:
    from benchmarks.kiln_bench.measure import geomean

    head = (f"{'model':<24} {'default ms':>11} {'autotune ms':>12} {'ratio':>7} {'compile s':>10} "
            f"{'mm: tmpl/cuBLAS':>16} {'max|d| eager':>13}  note")
    print(f"\nkiln default vs kiln {MODE} ({device}); ratio = default / autotune (>1: autotune faster)")
    print(head)
    print("-" * len(head))
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<24} {'':>11} {'':>12} {'':>7} {'':>10} {'':>16} {'':>13}  {r['error'][:160]}")
            continue
        d, a = r["default_ms"], r[f"{MODE}_ms"]
        ratio = d / a if a > 0 else None
        if ratio:
            ratios.append(ratio)
        mm = f"{r['templates']}/{r['cublas']}"
        diff = max(r["default_diff"], r[f"{MODE}_diff"])
        print(f"{r['model']:<24} {_fmt(d, '11.3f')} {_fmt(a, '12.3f')} {_fmt(ratio, '7.3f')} "
              f"{_fmt(r[f'{MODE}_compile_s'], '10.1f')} {mm:>16} {_fmt(diff, '13.4f')}")
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
    import os

    os.environ["KILN_AUTOTUNE_CROSS_TARGET"] = target
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
    backend = resolve_backend("inductor", CompileOptions(mode=MODE))
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
    for field_name in ("sites", "problems", "cached", "candidates"):
        row[field_name] = sum(getattr(r, field_name) for r in reports.reports)
    row["jobs"] = sum(r.compile.jobs for r in reports.reports)
    row["failed"] = sum(r.compile.failed for r in reports.reports)
    row["tune_compile_s"] = sum(r.compile.seconds for r in reports.reports)
    row["workers"] = max([r.compile.workers for r in reports.reports] or [0])
    row["kinds"] = [dict(r.kinds) for r in reports.reports]
    return row


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
    a = p.parse_args(argv)
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(SUITE)}")
    if a.device == "cpu":
        print(f"note: on CPU {MODE} has nothing to tune (matmul templates and Triton kernel configurations "
              "are tuned on a CUDA device): both columns run the same C++ kernels.")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in names:
        left = a.budget_s - (time.perf_counter() - t0)
        if left <= 0:
            rows.append({"model": name, "error": f"skipped: time budget of {a.budget_s:.0f}s spent"})
            continue
        kwargs = {"name": name, "small": a.small, "device": a.device, "iters": a.iters}
        print(f"[{time.perf_counter() - t0:7.1f}s] {name} ...", file=sys.stderr, flush=True)
        if a.in_process:
            try:
                row = measure_model(**kwargs)
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
                row = {"model": name, "error": f"{type(e).__name__}: {e}".replace("\n", " | ")}
        else:
            from benchmarks.kiln_bench.isolate import run_isolated

            row = run_isolated("benchmarks.autotune_suite:measure_model", kwargs,
                               timeout_s=min(a.model_timeout_s, max(60.0, left)))
            row.setdefault("model", name)
            if "error" in row:
                row["error"] = str(row["error"]).replace("\n", " | ")[-300:]
        rows.append(row)
    print_table(rows, a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
