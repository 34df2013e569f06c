"""``kiln demo``: the main job. Compiles the built-in models, shows every stage, times them, and
round-trips an ahead-of-time artifact through a fresh process."""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import kiln
from kiln.backends import resolve_backend
from kiln.demo_models import demo_models
from kiln.graph import BackendUnavailable
from kiln.settings import CompileOptions

PREFERENCE = ("inductor", "aot_eager", "eager")


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


def time_call(fn: Callable[[], Any], device: torch.device, iters: int = 20) -> float:
    """Median seconds per call after warm-up."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run_demo(device_name: str | None = None, backend: str | None = None, show_graphs: bool = True,
             console: Console | None = None) -> int:
    console = console or Console()
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = best_backend(console, backend)
    console.rule(f"kiln demo: backend [bold]{name}[/] on [bold]{device}[/]")
    table = Table("model", "graphs", "breaks", "compile s", "eager ms", "kiln ms", "speedup",
                  "max abs err")
    ok = True
    with torch.no_grad():
        for model_name, model, x in demo_models(device):
            with console.status(f"explaining {model_name}"):
                report = kiln.explain(model)(x)
            if show_graphs:
                console.print(f"[bold]{model_name}[/]: captured graphs, breaks and guards")
                console.print(report.as_text(), markup=False, highlight=False)
            compiled = kiln.compile(model, backend=name)
            with console.status(f"compiling {model_name} with {name}"):
                t0 = time.perf_counter()
                out = compiled(x)
                _sync(device)
                compile_s = time.perf_counter() - t0
            expected = model(x)
            err = (out - expected).abs().max().item()
            ok &= torch.allclose(out, expected, rtol=1e-3, atol=1e-3)
            t_eager = time_call(functools.partial(model, x), device)
            t_kiln = time_call(functools.partial(compiled, x), device)
            table.add_row(model_name, str(report.graph_count), str(report.break_count),
                          f"{compile_s:.2f}", f"{t_eager * 1e3:.3f}", f"{t_kiln * 1e3:.3f}",
                          f"{t_eager / t_kiln:.2f}x", f"{err:.1e}")
    console.print(table)
    ok &= roundtrip_artifact(console, name, device)
    console.print("[green]demo OK[/]" if ok else "[red]demo found a mismatch[/]")
    return 0 if ok else 1


def roundtrip_artifact(console: Console, backend: str, device: torch.device) -> bool:
    """AOT-compile the transformer block, save it, load it in a fresh process, compare with eager."""
    model_name, model, x = demo_models(device)[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{model_name}.kiln"
        with console.status("ahead-of-time compiling and saving an artifact"), torch.no_grad():
            compiled = kiln.compile(model, fullgraph=True, backend=backend).forward.aot_compile(
                ((x,), {}))
            compiled.save_compiled_function(path)
        console.print(f"saved artifact {path.name} ({_size(path)} bytes); loading in a fresh process")
        proc = subprocess.run(
            [sys.executable, "-m", "kiln.cli", "check-artifact", str(path), model_name, str(device)],
            capture_output=True, text=True, timeout=600,
        )
    console.print(proc.stdout.strip(), markup=False)
    if proc.returncode != 0:
        console.print(f"[red]fresh-process load failed:[/]\n{proc.stderr[-3000:]}", markup=False)
    return proc.returncode == 0


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def check_artifact(path: str, model_name: str, device_name: str) -> int:
    """Run in a fresh process: load the artifact, run it on the demo input, compare with eager."""
    device = torch.device(device_name)
    models = {name: (model, x) for name, model, x in demo_models(device)}
    model, x = models[model_name]
    t0 = time.perf_counter()
    loaded = kiln.load_compiled_function(path)
    with torch.no_grad():
        out = loaded(model, x)
        load_s = time.perf_counter() - t0
        expected = model(x)
    err = (out - expected).abs().max().item()
    same = torch.allclose(out, expected, rtol=1e-3, atol=1e-3)
    print(f"fresh process: load + first call {load_s:.3f} s, max abs err {err:.1e}, "
          f"{'matches eager' if same else 'MISMATCH'}")
    return 0 if same else 1
