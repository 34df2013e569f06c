"""Deployment side by side, one table: a packaged model (kiln.export + kiln.package) run from C++ (kiln::Runner,
examples/deploy_cpp/main.cpp, no Python in its process) and from Python (kiln.load_package, the same model.so),
against kiln.compile, AOTInductor (torch.export + torch._inductor.aoti_compile_and_package, run through
aoti_load_package) and eager, on one device, in one process (C++ in a child), methods alternated in rounds.

    uv run python -m benchmarks.deploy_latency --short                  # CPU, small inputs, a few minutes
    python -m benchmarks.deploy_latency --device cuda --dtype bfloat16  # on a GPU
    python -m benchmarks.deploy_latency --models transformer --no-aoti --iters 100 --threads 1

Models: ``transformer`` (examples/deploy_cpp's pre-norm transformer over token ids), ``resnet18`` (torchvision's,
random weights, batch-norm statistics randomised) and ``cnn`` (the example's width-16 ResNet-18 layout).
``--short``: the transformer's small config, images of 64x64, fewer iterations and rounds. ``--threads N``:
every method on N CPU threads (the C++ program through OMP_NUM_THREADS); on a shared machine, oversubscribed
OpenMP threads make the multi-threaded methods' times noise.

Columns: median ms per call (median of the rounds' medians; on CUDA every call ends with a synchronize), the
ratios to eager and to AOTInductor, load + first call (kiln::Runner: measured inside the C++ process;
load_package and AOTInductor: loading the package and the first call in this process; kiln.compile and
eager: the first call, which for kiln.compile is capture + compile), the package's size on disk (kiln:
model.so, weights, manifest and cubins, not the sources kept for reading; AOTInductor: the .pt2), the time
to build it (kiln: export + package; AOTInductor: torch.export + compile, in a child process with
``--aoti-timeout``), and the largest difference from eager's output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
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
from safetensors.torch import save_file

import kiln

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from models import example, randomize_batch_norms  # noqa: E402

MODELS = ("transformer", "resnet18", "cnn")


def load_model(name: str, short: bool, device: str, dtype: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """(model in eval mode on ``device`` in ``dtype``, inputs); the same weights in every process (seeded)."""
    if name == "resnet18":
        import torchvision  # noqa: PLC0415 (only this model needs it)

        torch.manual_seed(0)
        model: torch.nn.Module = randomize_batch_norms(torchvision.models.resnet18()).eval()
        size = 64 if short else 224
        inputs: tuple[torch.Tensor, ...] = (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)
    elif name == "cnn":
        model, inputs = example("resnet18", small=True)
    elif name == "transformer":
        model, inputs = example("transformer", small=short)
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    dt = getattr(torch, dtype)
    return model.to(device, dt), tuple(x.to(device, dt if x.is_floating_point() else x.dtype) for x in inputs)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], iters: int, device: str) -> float:
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def timed_first(fn: Callable[[], object], device: str) -> tuple[object, float]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, 1e3 * (time.perf_counter() - t0)


def max_err(got: object, want: torch.Tensor) -> float:
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert isinstance(got, torch.Tensor)
    return (got.detach().float().cpu() - want.float().cpu()).abs().max().item()


def build_main(out: Path, device: str) -> Path:
    cuda = ["--cuda"] if device == "cuda" else []
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", *cuda, "--cflags", "--ldflags"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = out / "main"
    subprocess.run(["g++", "-O2", str(EXAMPLE / "main.cpp"), *flags, "-o", str(exe)], check=True)
    return exe


@dataclass
class CppRun:
    median_ms: float
    load_ms: float
    first_ms: float
    err: float


def cpp_run(exe: Path, pkg: Path, inputs: Path, expected: Path, iters: int, device: str) -> CppRun:
    """kiln::Runner in the C++ program: its median, load and first-run times and error, measured there."""
    cuda = ["--cuda"] if device == "cuda" else []
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # the threads this process uses
    r = subprocess.run([str(exe), *cuda, "--tol", "1e30", str(pkg), str(inputs), str(expected), str(iters)],
                       capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    m = re.search(r"latency_ms median ([\d.]+)", out)
    load = re.search(r"load_ms ([\d.]+) first_run_ms ([\d.]+)", out)
    err = re.search(r"max_abs_err (\S+)", out)
    if r.returncode != 0 or not m or not load or not err or "libpython mapped: no" not in out:
        raise RuntimeError(f"{exe.name} failed ({r.returncode}):\n{out}")
    return CppRun(float(m.group(1)), float(load.group(1)), float(load.group(2)), float(err.group(1)))


def folder_bytes(path: Path) -> int:
    """A package's files that a runner reads (not the sources kept for reading in src/)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "src" not in p.relative_to(path).parts)


def aoti_build(name: str, args: argparse.Namespace, out: Path) -> tuple[Path | None, float, str]:
    """(the .pt2, build seconds, note) from a child process (torch.export + AOTInductor), under a timeout."""
    pt2 = out / f"{name}.pt2"
    cmd = [sys.executable, "-m", "benchmarks.deploy_latency", "--aoti-child", name, "--aoti-out", str(pt2),
           "--device", args.device, "--dtype", args.dtype, *(["--short"] if args.short else []),
           *(["--threads", str(args.threads)] if args.threads else [])]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.aoti_timeout,
                           cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, f"AOTInductor build passed --aoti-timeout {args.aoti_timeout} s"
    if r.returncode != 0 or not pt2.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        return None, time.perf_counter() - t0, f"AOTInductor build failed: {tail[0][:160]}"
    return pt2, float(json.loads(r.stdout.strip().splitlines()[-1])["build_s"]), ""


def inductor() -> Any:
    """torch._inductor: the reference, outside kiln (imported only when AOTInductor runs)."""
    return importlib.import_module("torch._inductor")


def aoti_child(name: str, pt2: Path, args: argparse.Namespace) -> None:
    model, inputs = load_model(name, args.short, args.device, args.dtype)
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
        inductor().aoti_compile_and_package(ep, package_path=str(pt2))
    print(json.dumps({"build_s": time.perf_counter() - t0}))


@dataclass
class Row:
    model: str
    method: str
    rounds: list[float]
    first_ms: float
    size_bytes: int | None = None
    build_s: float | None = None
    err: float | None = None

    @property
    def ms(self) -> float:
        return statistics.median(self.rounds)


def bench(name: str, args: argparse.Namespace, exe: Path, out: Path) -> tuple[list[Row], list[str]]:
    device = args.device
    model, inputs = load_model(name, args.short, device, args.dtype)
    notes = []
    with torch.no_grad():
        want, eager_first = timed_first(lambda: model(*inputs), device)
        assert isinstance(want, torch.Tensor)
        t0 = time.perf_counter()
        report = kiln.package(kiln.export(model, inputs), out / name, device=device)
        kiln_build = time.perf_counter() - t0
        notes.append(f"{name}: {report.as_text()}")
        save_file({"input0": inputs[0].cpu()}, str(out / f"{name}.in.safetensors"))
        save_file({"output0": want.cpu()}, str(out / f"{name}.out.safetensors"))
        def load_kiln() -> tuple[Callable[..., object], object]:
            runner = kiln.load_package(out / name)
            return runner, runner(*inputs)

        (loaded_fn, loaded_out), py_load_first = timed_first(load_kiln, device)  # type: ignore[misc]
        compiled = kiln.compile(model)
        compiled_out, kc_first = timed_first(lambda: compiled(*inputs), device)
        methods: dict[str, Callable[[], object]] = {"eager": lambda: model(*inputs),
                                                    "kiln.compile": lambda: compiled(*inputs),
                                                    "kiln load_package": lambda: loaded_fn(*inputs)}
        rows = {"eager": Row(name, "eager", [], eager_first, err=0.0),
                "kiln.compile": Row(name, "kiln.compile", [], kc_first, err=max_err(compiled_out, want)),
                "kiln load_package": Row(name, "kiln load_package", [], py_load_first, folder_bytes(out / name),
                                         kiln_build, max_err(loaded_out, want))}
        if args.aoti:
            pt2, aoti_s, note = aoti_build(name, args, out)
            if pt2 is None:
                notes.append(f"{name}: {note}")
            else:
                def load_aoti() -> tuple[Callable[..., object], object]:
                    runner = inductor().aoti_load_package(str(pt2))
                    return runner, runner(*inputs)

                (aoti_runner, aoti_out), aoti_first = timed_first(load_aoti, device)  # type: ignore[misc]
                methods["AOTInductor"] = lambda: aoti_runner(*inputs)
                rows["AOTInductor"] = Row(name, "AOTInductor", [], aoti_first, pt2.stat().st_size, aoti_s,
                                          max_err(aoti_out, want))
        for fn in methods.values():  # warm up
            fn()
        cpp = Row(name, "kiln::Runner (C++)", [], 0.0, folder_bytes(out / name), kiln_build)
        for _ in range(args.rounds):  # rounds, alternating
            for k, fn in methods.items():
                rows[k].rounds.append(median_ms(fn, args.iters, device))
            run = cpp_run(exe, out / name, out / f"{name}.in.safetensors", out / f"{name}.out.safetensors",
                          args.iters, device)
            cpp.rounds.append(run.median_ms)
            cpp.first_ms, cpp.err = run.load_ms + run.first_ms, run.err
            notes.append(f"{name}: kiln::Runner (round {len(cpp.rounds)}) load {run.load_ms:.1f} ms + first run "
                         f"{run.first_ms:.1f} ms")
    order = ["eager", "kiln.compile", "AOTInductor", "kiln load_package"]
    return [rows[k] for k in order if k in rows] + [cpp], notes


def table(rows: list[Row]) -> str:
    head = ("| model | method | median ms | vs eager | vs AOTI | load + first ms | package MB | build s | "
            "max err |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        base = {x.method: x.ms for x in rows if x.model == r.model}
        aoti = base.get("AOTInductor")

        def opt(v: float | int | None, fmt: str) -> str:
            return "" if v is None else format(v, fmt)

        lines.append(f"| {r.model} | {r.method} | {r.ms:.3f} | {base['eager'] / r.ms:.2f}x | "
                     f"{'' if aoti is None else format(aoti / r.ms, '.2f') + 'x'} | {r.first_ms:.1f} | "
                     f"{opt(None if r.size_bytes is None else r.size_bytes / 1e6, '.2f')} | {opt(r.build_s, '.1f')} | "
                     f"{opt(r.err, '.1e')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="transformer,resnet18")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--short", action="store_true", help="small inputs, fewer iterations and rounds")
    ap.add_argument("--iters", type=int, default=None, help="calls per round (default 50; --short 10)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --short 2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for every method, the C++ program's too (default: torch's)")
    ap.add_argument("--no-aoti", dest="aoti", action="store_false", help="leave AOTInductor out")
    ap.add_argument("--aoti-timeout", type=int, default=900, help="seconds for one AOTInductor build")
    ap.add_argument("--aoti-child", help=argparse.SUPPRESS)
    ap.add_argument("--aoti-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.aoti_child:
        aoti_child(args.aoti_child, Path(args.aoti_out), args)
        return
    args.iters = args.iters or (10 if args.short else 50)
    args.rounds = args.rounds or (2 if args.short else 3)
    out = Path(tempfile.mkdtemp(prefix="kiln-deploy-bench-"))
    exe = build_main(out, args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    rows, notes = [], []
    for name in args.models.split(","):
        r, n = bench(name, args, exe, out)
        rows += r
        notes += n
    print(f"torch {torch.__version__}, {args.device} ({where}), {args.dtype}, {args.iters} calls x {args.rounds} "
          f"rounds{', short' if args.short else ''}; ratios are speedups (>1: faster than eager / AOTInductor)")
    print(table(rows))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
