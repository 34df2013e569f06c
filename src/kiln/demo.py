"""``kiln demo``: the main job. Compiles the built-in models, times them against eager, and round-trips
their ahead-of-time artifacts through a fresh process; prints one summary table (``--verbose``: each
model's captured graphs and guards too)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.table import Table

import kiln
from kiln.backends import resolve_backend
from kiln.compile_stats import stats
from kiln.demo_models import demo_models
from kiln.graph import BackendUnavailable
from kiln.settings import CompileOptions

PREFERENCE = ("inductor", "aot_eager", "eager")
RTOL = ATOL = 1e-3


def best_backend(console: Console, wanted: str | None) -> str:
    """The requested backend, or the most complete one whose stages exist (said plainly)."""
    for name in (wanted,) if wanted else PREFERENCE:
        try:
            resolve_backend(name, CompileOptions(backend=name))
            return name
        except BackendUnavailable as e:
            if wanted:
                raise
            console.print(f"[yellow]backend {name!r} is not available yet:[/] {e}")
    raise BackendUnavailable("no kiln backend is available")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: torch.device, budget_s: float = 0.5, max_iters: int = 20) -> float:
    """Median seconds per call after two warm-up calls: at least 3 samples, then until ``budget_s``."""
    for _ in range(2):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 3 or (len(samples) < max_iters and time.perf_counter() - start < budget_s):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@dataclass(frozen=True)
class ModelRow:
    """One model's line of the summary."""

    name: str
    graphs: int
    breaks: int
    compile_s: float  # capture + backend, from kiln.stats()
    eager_ms: float
    kiln_ms: float
    max_err: float
    matches: bool
    artifact: str = "-"  # the fresh-process round trip's result

    def cells(self) -> list[str]:
        speedup = f"{self.eager_ms / self.kiln_ms:.2f}x" + ("" if self.matches else f" MISMATCH {self.max_err:.1e}")
        return [self.name, str(self.graphs), str(self.breaks), f"{self.compile_s:.2f}", _ms(self.eager_ms),
                _ms(self.kiln_ms), speedup, self.artifact]


COLUMNS = ("model", "graphs", "breaks", "compile s", "eager ms", "kiln ms", "speedup", "artifact")


def _ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def run_demo(device_name: str | None = None, backend: str | None = None, verbose: bool = False,
             console: Console | None = None) -> int:
    console = console or Console()
    t_start = time.perf_counter()
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = best_backend(console, backend)
    console.rule(f"kiln demo: backend [bold]{name}[/] on [bold]{device}[/]")
    rows = []
    with torch.no_grad():
        for model_name, model, x in demo_models(device):
            if verbose:
                console.print(f"[bold]{model_name}[/]: captured graphs, breaks and guards")
                console.print(kiln.explain(model)(x).as_text(), markup=False, highlight=False)
            with console.status(f"compiling {model_name} with {name}"):
                rows.append(_measure(model_name, model, x, name, device))
    artifacts = roundtrip_artifacts(console, name, device)
    rows = [_with_artifact(r, artifacts.get(r.name)) for r in rows]
    table = Table(*COLUMNS, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in table.columns:
        column.no_wrap = True
    for r in rows:
        table.add_row(*r.cells())
    console.print(table)
    console.print("compile s: capture + backend (kiln.stats()); outputs match eager within 1e-3 unless marked; "
                  "artifact: saved by aot_compile, loaded in a fresh process (load + first call s), checked "
                  "against eager", style="dim")
    ok = all(r.matches for r in rows) and bool(artifacts) and all(a["matches"] for a in artifacts.values())
    took = f"in {time.perf_counter() - t_start:.0f} s"
    console.print(f"[green]demo OK[/] {took}" if ok else f"[red]demo found a mismatch[/] {took}")
    return 0 if ok else 1


def _measure(model_name: str, model: torch.nn.Module, x: torch.Tensor, backend: str,
             device: torch.device) -> ModelRow:
    compiled = kiln.compile(model, backend=backend)
    before = stats()
    out = compiled(x)
    _sync(device)
    delta = stats() - before
    expected = model(x)
    return ModelRow(
        model_name, delta.graphs_compiled, delta.graph_breaks, delta.total_compile_seconds,
        1e3 * time_call(lambda: model(x), device), 1e3 * time_call(lambda: compiled(x), device),
        (out - expected).abs().max().item(), torch.allclose(out, expected, rtol=RTOL, atol=ATOL))


def _with_artifact(row: ModelRow, result: dict[str, Any] | None) -> ModelRow:
    if result is None:
        return row
    text = f"ok {result['seconds']:.2f} s" if result["matches"] else f"MISMATCH ({result['max_err']:.1e})"
    return ModelRow(**{**row.__dict__, "artifact": text})


def roundtrip_artifacts(console: Console, backend: str, device: torch.device) -> dict[str, dict[str, Any]]:
    """AOT-compile every demo model, save it, load and run each in one fresh process; its results."""
    with tempfile.TemporaryDirectory() as tmp:
        args = []
        with console.status("ahead-of-time compiling and saving artifacts"), torch.no_grad():
            for model_name, model, x in demo_models(device):
                path = Path(tmp) / f"{model_name}.kiln"
                compiled = kiln.compile(model, fullgraph=True, backend=backend).forward.aot_compile(((x,), {}))
                compiled.save_compiled_function(path)
                args.append(f"{path}={model_name}")
        with console.status("loading the artifacts in a fresh process"):
            proc = subprocess.run([sys.executable, "-m", "kiln.cli", "check-artifact", str(device), *args],
                                  capture_output=True, text=True, timeout=600)
    results = {r["model"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    if len(results) != len(args):  # it raised (a mismatch alone exits 1 after printing every result)
        console.print(f"fresh-process load failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                      markup=False, style="red")
    return results


def check_artifacts(device_name: str, items: list[str]) -> int:
    """Run in a fresh process: load each ``PATH=MODEL`` artifact, run it on the demo input, compare with
    eager; one JSON line per artifact."""
    device = torch.device(device_name)
    models = {name: (model, x) for name, model, x in demo_models(device)}
    ok = True
    for item in items:
        path, _, model_name = item.rpartition("=")
        model, x = models[model_name]
        t0 = time.perf_counter()
        loaded = kiln.load_compiled_function(path)
        with torch.no_grad():
            out = loaded(model, x)
            _sync(device)
            seconds = time.perf_counter() - t0
            expected = model(x)
        same = torch.allclose(out, expected, rtol=RTOL, atol=ATOL)
        ok &= same
        print(json.dumps({"model": model_name, "seconds": seconds, "matches": same,
                          "max_err": (out - expected).abs().max().item()}))
    return 0 if ok else 1
