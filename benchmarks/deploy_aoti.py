"""AOTInductor's side of benchmarks/deploy_latency.py, in processes that import torch and never kiln.

torch's ``aoti_load_package`` segfaulted (H200, torch 2.11) in the process that also held kiln, so
deploy_latency keeps AOTInductor out of its own process: it runs this module twice per model,

    python -m benchmarks.deploy_aoti build NAME PT2 [--short] [--device D] [--dtype T] [--threads N]
    python -m benchmarks.deploy_aoti serve NAME PT2 OUT.safetensors --iters K [same options]

``build``: torch.export + ``aoti_compile_and_package``; prints one line ``AOTI {"build_s": ...}``.
``serve``: loads the package (timed: load, then the first call), writes the first call's output to
OUT.safetensors (deploy_latency compares it with eager's), warms up, prints
``AOTI {"import_ms", "load_ms", "first_ms"}`` (importing torch._inductor is timed apart from the load),
then answers each line ``round`` on stdin with ``AOTI {"median_ms": ...}`` (median of K calls, each ending
with a CUDA synchronize on the GPU) until stdin closes: the parent alternates these rounds with its own methods'.

Model, weights and inputs come from :func:`load_model` with the same seeds as in deploy_latency's process, and
:func:`median_ms` / :func:`timed_first` are the timing both processes use.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from models import example, randomize_batch_norms  # noqa: E402

MODELS = ("transformer", "resnet18", "cnn")
PREFIX = "AOTI "


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


def inductor() -> Any:
    """torch._inductor: the reference, outside kiln (only ever imported in this module's processes)."""
    return importlib.import_module("torch._inductor")


def reply(**kw: float) -> None:
    print(PREFIX + json.dumps(kw), flush=True)


def build(args: argparse.Namespace) -> None:
    model, inputs = load_model(args.name, args.short, args.device, args.dtype)
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
        inductor().aoti_compile_and_package(ep, package_path=args.pt2)
    reply(build_s=time.perf_counter() - t0)


def serve(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file  # noqa: PLC0415

    _, inputs = load_model(args.name, args.short, args.device, args.dtype)
    # the import is Python start-up, not package load (kiln's load_package is timed with kiln imported):
    # timed apart (20-30 s on the loaded 2-core development machine)
    _, import_ms = timed_first(inductor, args.device)
    with torch.no_grad():
        runner, load_ms = timed_first(lambda: inductor().aoti_load_package(args.pt2), args.device)
        assert callable(runner)
        out, first_ms = timed_first(lambda: runner(*inputs), args.device)
        out = out[0] if isinstance(out, (list, tuple)) else out
        assert isinstance(out, torch.Tensor)
        save_file({"output0": out.detach().cpu().contiguous()}, args.out)
        runner(*inputs)  # warm up, as the parent warms its methods
        reply(import_ms=import_ms, load_ms=load_ms, first_ms=first_ms)
        for line in sys.stdin:
            if line.strip() != "round":
                raise SystemExit(f"unexpected request {line.strip()!r}")
            reply(median_ms=median_ms(lambda: runner(*inputs), args.iters, args.device))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("build", "serve"))
    ap.add_argument("name", choices=MODELS)
    ap.add_argument("pt2")
    ap.add_argument("out", nargs="?", help="serve: where the first call's output goes (safetensors)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    faulthandler.enable()  # a crash in torch's loader leaves its trace in the log the parent quotes
    if any(m == "kiln" or m.startswith("kiln.") for m in sys.modules):  # the point of this process
        raise SystemExit("deploy_aoti: kiln is imported in AOTInductor's process")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "build":
        build(args)
    else:
        if not args.out:
            raise SystemExit("serve needs OUT.safetensors")
        serve(args)


if __name__ == "__main__":
    main()
