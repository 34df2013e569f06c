"""Where does a compiled step spend its time? One model, one backend: host (cProfile) and device
(torch.profiler kernel table) breakdown of the steady state, for finding overheads.

    python -m benchmarks.profile_step --model resnet50 --backend kiln --out DIR [--mode reduce-overhead]
    python -m benchmarks.profile_step --model decode --backend kiln --mode reduce-overhead --out DIR
    python -m benchmarks.profile_step --model stream --backend kiln --iters 40 --out DIR
    python -m benchmarks.profile_step --model generate-llama --backend kiln --iters 3 --out DIR

``--model decode`` is the bs=1 decode step of benchmarks.decode (full size on CUDA). ``--model stream``
steps through benchmarks.dynamic_stream's requests (changing batch and length), one request per step,
after one cold pass over the whole stream so that every compile is done. ``--model generate-llama``
(or ``generate-gpt2``) is one HF ``generate()`` of 32 greedy tokens per step as benchmarks.generate runs
it (fp32, batch 2, a growing DynamicCache; a 64-token generate first so that every compile is done). Suite models run
inference as the suite does (bf16 on CUDA, ``no_grad``), or a training step with ``--training``.
Writes ``<model>-<backend>.txt`` into ``--out``: wall ms per step, device busy ms per step, kernel
launches per step, the top host functions by own time and the top device kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench.models import build_for_mode
from benchmarks.kiln_bench.suite_worker import _step_fn


def _decode_step(device: str, spec: B.CompileSpec, backend: str) -> Callable[[], Any]:
    from benchmarks.kiln_bench.llama_decode import TINY, DecodeConfig, build_decoder

    cfg = DecodeConfig() if device.startswith("cuda") else TINY
    model = build_decoder(cfg, device, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    step = B.compile_fn(backend, model, spec)
    state = {"tok": torch.ones(1, 1, dtype=torch.long, device=device), "i": 0}
    positions = torch.arange(cfg.max_seq, device=device)

    def run() -> Any:
        with torch.no_grad():
            i = state["i"] % cfg.max_seq
            if backend == "torch_compile" and spec.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            tok = step(state["tok"], positions[i:i + 1])
            state["tok"] = tok.clone() if backend == "torch_compile" else tok
            state["i"] += 1
            return tok
    return run


def _stream_step(device: str, spec: B.CompileSpec, backend: str, small: bool) -> Callable[[], Any]:
    from benchmarks import dynamic_stream as S

    small = small or not device.startswith("cuda")
    model, vocab = S._build(small, device)
    pairs = S.stream(40, 64 if small else 512)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, vocab, (b, s), generator=gen).to(device) for b, s in pairs]
    run = B.compile_fn(backend, model, spec)
    state = {"i": 0}

    def step() -> Any:
        with torch.no_grad():
            out = run(inputs[state["i"] % len(inputs)])
        state["i"] += 1
        return out

    for _ in inputs:  # the cold pass: every compile happens here
        step()
    return step


def _generate_step(name: str, device: str, spec: B.CompileSpec, backend: str, small: bool) -> Callable[[], Any]:
    from benchmarks import generate as G

    model = G._build(name, small or not device.startswith("cuda"), device, bf16=False)
    prompt = torch.randint(1, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    model.forward = B.compile_fn(backend, model.forward, spec)
    G._generate(model, prompt, 64)  # every compile happens here
    return lambda: G._generate(model, prompt, 32)


def _suite_step(name: str, device: str, spec: B.CompileSpec, backend: str, training: bool,
                small: bool) -> Callable[[], Any]:
    dev = torch.device(device)
    case = build_for_mode(name, small=small, device=dev, training=training)
    run = B.compile_fn(backend, case.model, spec)
    return _step_fn(case, run, training, dev)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile(step: Callable[[], Any], device: str, iters: int, top: int) -> str:
    t0 = time.perf_counter()
    step()
    _sync(device)
    first = time.perf_counter() - t0
    for _ in range(5):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    _sync(device)
    wall_ms = (time.perf_counter() - t0) / iters * 1e3
    # host only: enqueue a few steps without waiting (few enough not to fill the launch queue)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    host_ms = (time.perf_counter() - t0) / 3 * 1e3
    _sync(device)
    # host: own time per Python function over the same steps
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        step()
    _sync(device)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    lines = [f"first call s: {first:.2f}", f"wall ms/step: {wall_ms:.3f}",
             f"host ms/step (3 steps enqueued without a sync): {host_ms:.3f}"]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
        step()
        _sync(device)
        lines.append(f"memory MB: held between steps {held / 2**20:.1f}, peak of one step "
                     f"{torch.cuda.max_memory_allocated() / 2**20:.1f}")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as tp:
        for _ in range(iters):
            step()
        _sync(device)
    events = tp.key_averages()
    dev_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    # device kernels only: ATen op events carry their kernels' device time too (counted twice)
    kernels = [e for e in events if getattr(e, dev_attr, 0) > 0 and not e.key.startswith(("aten::", "cuLaunch", "cuda"))
               and e.key != "cudaGraphLaunch"]
    busy = sum(getattr(e, dev_attr) for e in kernels) / iters / 1e3
    launches = sum(e.count for e in kernels) / iters
    lines += [f"device busy ms/step (sum of kernel times): {busy:.3f}",
              f"device ops per step: {launches:.1f}",
              "", "== top device kernels (self device time, whole run) =="]
    kernels.sort(key=lambda e: -getattr(e, dev_attr))
    for e in kernels[:top]:
        lines.append(f"{getattr(e, dev_attr) / iters / 1e3:9.3f} ms/step  x{e.count / iters:5.1f}  {e.key[:110]}")
    host_ops = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    lines += ["", "== host: top ops by self CPU time (torch profiler) =="]
    for e in host_ops[:25]:
        lines.append(f"{e.self_cpu_time_total / iters / 1e3:9.3f} ms/step  x{e.count / iters:5.1f}  {e.key[:90]}")
    lines += ["", "== host: top functions by own time over " + str(iters) + " steps ==", s.getvalue()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="kiln", choices=["kiln", "eager", "torch_compile"])
    p.add_argument("--mode", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--training", action="store_true")
    p.add_argument("--small", action="store_true")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (every input dim symbolic)")
    p.add_argument("--kiln-options", type=json.loads, default={},
                   help='kiln.compile(options=...) as JSON, e.g. \'{"wrapper": "cpp"}\'')
    args = p.parse_args(argv)
    spec = B.CompileSpec(mode=args.mode, kiln_options=tuple(sorted(args.kiln_options.items())),
                         dynamic=True if args.dynamic else None)
    if args.model == "decode":
        step = _decode_step(args.device, spec, args.backend)
    elif args.model == "stream":
        step = _stream_step(args.device, spec, args.backend, args.small)
    elif args.model.startswith("generate-"):
        step = _generate_step(args.model.removeprefix("generate-"), args.device, spec, args.backend, args.small)
    else:
        step = _suite_step(args.model, args.device, spec, args.backend, args.training, args.small)
    text = profile(step, args.device, args.iters, args.top)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.model}-{'train' if args.training else 'infer'}-{args.backend}-{args.mode or 'default'}"
    tag += "".join(f"-{k}={v}" for k, v in sorted(args.kiln_options.items())) + ("-dynamic" if args.dynamic else "")
    (args.out / f"{tag}.txt").write_text(text)
    print(f"== {tag} ==\n" + "\n".join(text.splitlines()[:4 + args.top // 2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
