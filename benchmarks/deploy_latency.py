"""Latency of a packaged model (kiln.package) run from C++ (kiln::Runner, examples/deploy_cpp/main.cpp)
against the same model in Python: eager, kiln.compile, kiln.load_package (the same model.so through
ctypes), and optionally AOTInductor (torch._inductor.aoti_compile_and_package + its loader).

    uv run python -m benchmarks.deploy_latency --models transformer,resnet18 [--small] [--aoti] [--iters 50]
    python -m benchmarks.deploy_latency --device cuda [--dtype bfloat16] --aoti      # on a GPU

Prints one table (median ms per call, one process, methods alternated in rounds) plus package load +
first-call times and sizes. On CUDA every timed call ends with a device synchronize (Python: torch.cuda.
synchronize(); the C++ program: the device guard's synchronizeDevice), the model and inputs are on the
GPU in ``--dtype``, and the package's cubins are compiled for this GPU.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

import kiln

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from models import example  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], iters: int, device: str = "cpu") -> float:
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def build_main(out: Path, device: str = "cpu") -> Path:
    cuda = ["--cuda"] if device == "cuda" else []
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", *cuda, "--cflags", "--ldflags"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = out / "main"
    subprocess.run(["g++", "-O2", str(EXAMPLE / "main.cpp"), *flags, "-o", str(exe)], check=True)
    return exe


def cpp_latency(exe: Path, pkg: Path, inputs: Path, iters: int, device: str = "cpu") -> tuple[float, float, float]:
    """(median ms per run, load ms, first-run ms) measured inside the C++ process."""
    cuda = ["--cuda"] if device == "cuda" else []
    r = subprocess.run([str(exe), *cuda, str(pkg), str(inputs), "-", str(iters)], capture_output=True, text=True)
    out = r.stdout + r.stderr
    m = re.search(r"latency_ms median ([\d.]+)", out)
    load = re.search(r"load_ms ([\d.]+) first_run_ms ([\d.]+)", out)
    if not m or not load or "libpython mapped: no" not in out:
        raise RuntimeError(f"main failed:\n{out}")
    return float(m.group(1)), float(load.group(1)), float(load.group(2))


def aoti(model: torch.nn.Module, inputs: tuple, out: Path) -> tuple[Callable[..., object], float, float]:
    """(runner, compile s, load + first call s) through AOTInductor (the reference, outside kiln)."""
    import torch._inductor  # noqa: PLC0415 (optional reference)

    t0 = time.perf_counter()
    ep = torch.export.export(model, inputs)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "model.pt2"))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    runner = torch._inductor.aoti_load_package(path)
    runner(*inputs)
    return runner, compile_s, time.perf_counter() - t0


def on_device(model: torch.nn.Module, inputs: tuple, device: str, dtype: str) -> tuple[torch.nn.Module, tuple]:
    dt = getattr(torch, dtype)
    model = model.to(device, dt)
    return model, tuple(x.to(device, dt if x.is_floating_point() else x.dtype) for x in inputs)


def bench(name: str, small: bool, iters: int, with_aoti: bool, exe: Path, out: Path, device: str = "cpu",
          dtype: str = "float32") -> list[str]:
    model, inputs = on_device(*example(name, small), device, dtype)
    rows = []
    with torch.no_grad():
        t0 = time.perf_counter()
        report = kiln.package(kiln.export(model, inputs), out / name, device=device)
        pkg_s = time.perf_counter() - t0
        save_file({"input0": inputs[0].cpu()}, str(out / f"{name}.in.safetensors"))
        t0 = time.perf_counter()
        loaded = kiln.load_package(out / name)
        loaded(*inputs)
        _sync(device)
        py_load_s = time.perf_counter() - t0
        compiled = kiln.compile(model)
        t0 = time.perf_counter()
        compiled(*inputs)
        _sync(device)
        kc_s = time.perf_counter() - t0
        methods: dict[str, Callable[[], object]] = {
            "eager": lambda: model(*inputs), "kiln.compile": lambda: compiled(*inputs),
            "load_package (py)": lambda: loaded(*inputs)}
        if with_aoti:
            runner, aoti_compile_s, aoti_load_s = aoti(model, inputs, out)
            methods["AOTInductor (py)"] = lambda: runner(*inputs)
        for fn in methods.values():  # warm up
            fn()
        results: dict[str, list[float]] = {k: [] for k in [*methods, "kiln::Runner (C++)"]}
        for _ in range(3):  # rounds, alternating
            for k, fn in methods.items():
                results[k].append(median_ms(fn, iters, device))
            results["kiln::Runner (C++)"].append(
                cpp_latency(exe, out / name, out / f"{name}.in.safetensors", iters, device)[0])
        _, cpp_load, cpp_first = cpp_latency(exe, out / name, out / f"{name}.in.safetensors", 1, device)
    rows.append(f"\n{name}{' (small)' if small else ''} on {device} {dtype}: {report.as_text()}; export+package {pkg_s:.1f} s; "
                f"kiln.compile first call {kc_s:.1f} s")
    rows.append(f"  package load + first call: C++ {cpp_load:.1f} + {cpp_first:.1f} ms, Python loader "
                f"{1e3 * py_load_s:.1f} ms")
    if with_aoti:
        rows.append(f"  AOTInductor: compile {aoti_compile_s:.1f} s, load + first call {1e3 * aoti_load_s:.1f} ms")
    rows.append(f"  {'method':<22} {'median ms':>10}  (rounds)")
    for k, v in results.items():
        rows.append(f"  {k:<22} {statistics.median(v):>10.3f}  ({', '.join(f'{x:.3f}' for x in v)})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="transformer,resnet18")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--aoti", action="store_true", help="also AOTInductor (slow to compile)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="kiln-deploy-bench-"))
    exe = build_main(out, args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    lines = [f"torch {torch.__version__}, {where}"]
    for name in args.models.split(","):
        lines += bench(name, args.small, args.iters, args.aoti, exe, out, args.device, args.dtype)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
