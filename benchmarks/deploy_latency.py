"""Deployment side by side: a packaged model (kiln.export + kiln.package) run from C++ (kiln::Runner,
examples/deploy_cpp/main.cpp, no Python in its process) and from Python (kiln.load_package, the same model.so),
against kiln.compile, AOTInductor (torch.export + torch._inductor.aoti_compile_and_package, run through
aoti_load_package) and eager, on one device, methods alternated in rounds. eager, kiln.compile and load_package
run in this process; kiln::Runner in a C++ child per round; AOTInductor in child processes that import torch and
never kiln (benchmarks/deploy_aoti.py: a build child, then one serving child per model that loads the .pt2 once
and times one round per request, with the same seeded model and inputs and the same timing).

    uv run python -m benchmarks.deploy_latency --short                  # CPU, small inputs, a few minutes
    python -m benchmarks.deploy_latency --device cuda --dtype bfloat16  # on a GPU
    python -m benchmarks.deploy_latency --device cuda --dtype bfloat16 --short --iters 50 --rounds 3  # ~2 min
    python -m benchmarks.deploy_latency --models transformer --no-aoti --iters 100 --threads 1

Models: ``transformer`` (examples/deploy_cpp's pre-norm transformer over token ids), ``resnet18`` (torchvision's,
random weights, batch-norm statistics randomised) and ``cnn`` (the example's width-16 ResNet-18 layout).
``--short``: the transformer's small config, images of 64x64, fewer iterations and rounds. ``--threads N``:
every method on N CPU threads (the C++ program through OMP_NUM_THREADS); on a shared machine, oversubscribed
OpenMP threads make the multi-threaded methods' times noise.

First table, one line per model: every method's median ms, AOTInductor's time over kiln::Runner's (>1: the
Runner is faster), load + first call of kiln's package (C++ and Python loaders) and of AOTInductor's, and the
package sizes. Second table, one line per method, columns: median ms per call (median of the rounds' medians; on CUDA every call ends with a synchronize), the
ratios to eager and to AOTInductor, load + first call (kiln::Runner: measured inside the C++ process;
load_package: loading the package and the first call in this process; AOTInductor: the same in its serving
child, whose CUDA context already exists as this process's does (inputs made first), torch._inductor imported
before (as kiln is here; the import's time is in the notes); kiln.compile and
eager: the first call, which for kiln.compile is capture + compile), the package's size on disk (kiln:
model.so, weights, manifest and cubins, not the sources kept for reading; AOTInductor: the .pt2), the time
to build it (kiln: export + package; AOTInductor: torch.export + compile, in its build child under
``--aoti-timeout``), and the largest difference from eager's output.
"""

from __future__ import annotations

import argparse
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

import torch
from safetensors.torch import load_file, save_file

import kiln
from benchmarks.deploy_aoti import PREFIX, load_model, median_ms, timed_first

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "deploy_cpp"


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


class AotiChild:
    """AOTInductor for one model, in child processes that import torch and never kiln (benchmarks/deploy_aoti.py):
    a build child under ``--aoti-timeout``, then a serving child that loads the package, reports load and first
    call, and times one round per :meth:`round`, so the parent can alternate it with its own methods."""

    def __init__(self, name: str, args: argparse.Namespace, out: Path) -> None:
        self.name, self.pt2, self.result = name, out / f"{name}.pt2", out / f"{name}.aoti-out.safetensors"
        self.common = ["--device", args.device, "--dtype", args.dtype, "--threads", str(torch.get_num_threads()),
                       *(["--short"] if args.short else [])]
        self.iters, self.timeout = args.iters, args.aoti_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.stderr = out / f"{name}.aoti-serve.log"

    def _cmd(self, *rest: str) -> list[str]:
        return [sys.executable, "-m", "benchmarks.deploy_aoti", *rest, *self.common]

    @staticmethod
    def _parse(text: str) -> dict[str, float] | None:
        for line in reversed(text.splitlines()):
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        return None

    def build(self) -> tuple[float | None, str]:
        """(build seconds, or None and why not)."""
        try:
            r = subprocess.run(self._cmd("build", self.name, str(self.pt2)), capture_output=True, text=True,
                               timeout=self.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return None, f"AOTInductor build passed --aoti-timeout {self.timeout} s"
        got = self._parse(r.stdout)
        if r.returncode != 0 or got is None or not self.pt2.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"AOTInductor build failed ({r.returncode}): {tail[0][:160]}"
        return got["build_s"], ""

    def start(self) -> dict[str, float]:
        """Starts the serving child; its load_ms and first_ms (raises RuntimeError if it fails)."""
        self.proc = subprocess.Popen(
            self._cmd("serve", self.name, str(self.pt2), str(self.result), "--iters", str(self.iters)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr.open("w"), text=True, cwd=ROOT)
        return self._answer()

    def _answer(self) -> dict[str, float]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        rc = self.proc.wait()
        tail = self.stderr.read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"AOTInductor serving child exited ({rc}): {' | '.join(tail)[:300]}")

    def round(self) -> float:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._answer()["median_ms"]

    def output(self) -> torch.Tensor:
        return load_file(str(self.result))["output0"]

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


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

        loaded, py_load_first = timed_first(load_kiln, device)
        assert isinstance(loaded, tuple)
        loaded_fn: Callable[..., object] = loaded[0]
        loaded_out = loaded[1]
        compiled = kiln.compile(model)
        compiled_out, kc_first = timed_first(lambda: compiled(*inputs), device)
        methods: dict[str, Callable[[], object]] = {"eager": lambda: model(*inputs),
                                                    "kiln.compile": lambda: compiled(*inputs),
                                                    "kiln load_package": lambda: loaded_fn(*inputs)}
        rows = {"eager": Row(name, "eager", [], eager_first, err=0.0),
                "kiln.compile": Row(name, "kiln.compile", [], kc_first, err=max_err(compiled_out, want)),
                "kiln load_package": Row(name, "kiln load_package", [], py_load_first, folder_bytes(out / name),
                                         kiln_build, max_err(loaded_out, want))}
        aoti = AotiChild(name, args, out) if args.aoti else None
        if aoti is not None:
            aoti_s, note = aoti.build()
            try:
                if aoti_s is None:
                    raise RuntimeError(note)
                got = aoti.start()
                rows["AOTInductor"] = Row(name, "AOTInductor", [], got["load_ms"] + got["first_ms"],
                                          aoti.pt2.stat().st_size, aoti_s, max_err(aoti.output(), want))
                notes.append(f"{name}: AOTInductor (child process) load {got['load_ms']:.1f} ms + first run "
                             f"{got['first_ms']:.1f} ms (import torch._inductor before it: {got['import_ms']:.0f} ms)")
            except RuntimeError as e:
                notes.append(f"{name}: {e}")
                aoti.close()
                aoti = None
        for fn in methods.values():  # warm up
            fn()
        cpp = Row(name, "kiln::Runner (C++)", [], 0.0, folder_bytes(out / name), kiln_build)
        try:
            for _ in range(args.rounds):  # rounds, alternating
                for k, fn in methods.items():
                    rows[k].rounds.append(median_ms(fn, args.iters, device))
                if aoti is not None:
                    try:
                        rows["AOTInductor"].rounds.append(aoti.round())
                    except RuntimeError as e:
                        notes.append(f"{name}: {e}")
                        aoti.close()
                        aoti = None
                run = cpp_run(exe, out / name, out / f"{name}.in.safetensors", out / f"{name}.out.safetensors",
                              args.iters, device)
                cpp.rounds.append(run.median_ms)
                cpp.first_ms, cpp.err = run.load_ms + run.first_ms, run.err
                notes.append(f"{name}: kiln::Runner (round {len(cpp.rounds)}) load {run.load_ms:.1f} ms + first "
                             f"run {run.first_ms:.1f} ms")
        finally:
            if aoti is not None:
                aoti.close()
    order = ["eager", "kiln.compile", "AOTInductor", "kiln load_package"]
    return [rows[k] for k in order if k in rows and rows[k].rounds] + [cpp], notes


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


SUMMARY = (("kiln::Runner (C++)", "Runner"), ("kiln load_package", "load_package"), ("kiln.compile", "kiln.compile"),
           ("AOTInductor", "AOTI"), ("eager", "eager"))


def summary(rows: list[Row]) -> str:
    """One line per model: the methods' median ms, Runner / AOTInductor, load + first call and package size of
    kiln's package (C++ and Python loaders) against AOTInductor's."""
    lines = ["| model | " + " | ".join(f"{short} ms" for _, short in SUMMARY) + " | AOTI / Runner | "
             "load + first ms (Runner / load_package / AOTI) | package MB (kiln / AOTI) |", "|" + "---|" * 9]
    for model in dict.fromkeys(r.model for r in rows):
        by = {r.method: r for r in rows if r.model == model}

        def get(method: str, fmt: Callable[[Row], str], by: dict[str, Row] = by) -> str:
            return fmt(by[method]) if method in by else "-"

        speed = "-"
        if "AOTInductor" in by:
            speed = f"{by['AOTInductor'].ms / by['kiln::Runner (C++)'].ms:.2f}x"
        first = " / ".join(get(m, lambda r: f"{r.first_ms:.1f}")
                           for m in ("kiln::Runner (C++)", "kiln load_package", "AOTInductor"))
        size = " / ".join(get(m, lambda r: f"{(r.size_bytes or 0) / 1e6:.2f}") for m in ("kiln load_package",
                                                                                         "AOTInductor"))
        lines.append(f"| {model} | " + " | ".join(get(m, lambda r: f"{r.ms:.3f}") for m, _ in SUMMARY)
                     + f" | {speed} | {first} | {size} |")
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
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
    print(summary(rows))
    print()
    print(table(rows))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
