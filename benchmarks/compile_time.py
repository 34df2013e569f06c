"""Cold compile time, kiln vs torch.compile, with kiln's time per stage (issue #6).

    uv run python -m benchmarks.compile_time --models bert_base,gpt2,vit_base_patch16_224 \
        --modes inference,training [--device cpu] [--small] [--cross-cuda] [--profile DIR]

Every row runs in a fresh process with empty caches (KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR point at new temporary folders). Cold compile = first call - steady call, where each
process first compiles a trivial function so one-time imports are not charged to the model.

kiln's stages (capture, autograd joint trace / partition, decomp, lowering, scheduling, codegen, C++
compile, wrapper load = Triton compile on a GPU, graph-cache store; "other" = the first run of the
compiled code plus glue) are measured by wrapping those stages' entry points from the outside
(``kiln_bench/spans.py``); they are exclusive and add up to the first call.

``--cross-cuda`` compiles for CUDA from a host without a GPU: the model is captured on the CPU, then
the captured graph goes through kiln's inductor backend with fake CUDA example inputs (bf16 for
inference), so Triton sources are generated but not run. This measures the Python side of the GPU
path; torch.compile has no such mode, so those rows are kiln only. Training traces the joint graph on
the CPU under CPU autocast (torch's autograd engine needs a real CUDA device for CUDA tensors, fake
or not) and compiles the forward and backward graphs for CUDA (``_retargeting``). The benchmark's own
moves of graphs and inputs to CUDA are left out of every figure, and Python's cyclic GC is paused
while the model compiles, as ``kiln.compile`` pauses it (``kiln.graph.gc_paused``).
``--cross-triton cuda:90`` (with ``--cross-cuda``) also compiles every generated Triton kernel for that
target, on kiln's compile worker processes as on a GPU (``KILN_TRITON_CROSS_TARGET``): the whole GPU
cold compile but the first run (and, with triton <= 3.6, its C launcher builds, which the workers do
on a GPU host), per stage in wall seconds.
``--profile DIR`` also writes a cProfile of each kiln first call to DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench.isolate import run_isolated
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro
from benchmarks.kiln_bench.spans import ORDER, StageTimer, cpu_clock


def _warm_up(backend: str, device: str) -> None:
    """Pay one-time imports and initialisation on a small function (a reduction over a view: sympy
    imports parts of itself lazily on the first index arithmetic)."""
    warm = B.compile_fn(backend, lambda x: torch.softmax(x.t() * 2, -1).sum(0), B.CompileSpec())
    warm(torch.randn(4, 8, device=device))
    if backend == "torch_compile":
        torch._dynamo.reset()


def _step(case: Any, run: Any, training: bool, device: torch.device) -> Any:
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if training and device.type == "cuda"
           else contextlib.nullcontext())
    if not training:
        with torch.no_grad():
            return run(*case.args, **case.kwargs)
    case.model.zero_grad(set_to_none=True)
    with amp:
        loss = case.loss_fn(run(*case.args, **case.kwargs), case.targets)
    loss.backward()
    return loss.detach()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(*, backend: str, model: str, mode: str, small: bool, device: str,
            profile: str | None = None, warm_up: bool = True) -> dict[str, Any]:
    """Child process: cold compile seconds (and kiln's stages) of one (model, mode, backend).
    ``warm_up=False``: the model is the process's first compile, as in the suite (one-time imports and
    kiln's Triton compile workers starting are charged to it)."""
    from benchmarks.kiln_bench.models import build_for_mode

    dev, training = torch.device(device), mode == "training"
    result: dict[str, Any] = {"backend": backend, "model": model, "mode": mode}
    try:
        if warm_up:
            _warm_up(backend, device)
        case = build_for_mode(model, small=small, device=dev, training=training)
        compiled = B.compile_fn(backend, case.model, B.CompileSpec())
        timer = StageTimer(cpu_clock).install() if backend == "kiln" else None
        prof = _profiler(profile)
        _sync(dev)
        t0, c0 = time.perf_counter(), cpu_clock()
        with prof:
            _step(case, compiled, training, dev)
            _sync(dev)
        first, first_cpu = time.perf_counter() - t0, cpu_clock() - c0
        if timer is not None:
            timer.uninstall()
        steady, steady_cpu = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), cpu_clock()
            _step(case, compiled, training, dev)
            _sync(dev)
            steady.append(time.perf_counter() - t0)
            steady_cpu.append(cpu_clock() - c0)
    except Exception as exc:  # noqa: BLE001 - the row records why
        return dict(result, error=B.short_error(exc), details=B.error_details(exc))
    _save_profile(prof, profile, f"{backend}-{model}-{mode}-{device}")
    step, step_cpu = sorted(steady)[1], sorted(steady_cpu)[1]
    out = dict(result, compile_s=round(first - step, 3), first_s=round(first, 3),
               steady_ms=round(step * 1e3, 2), compile_cpu_s=round(first_cpu - step_cpu, 3))
    if timer is not None:
        out["stages"] = timer.report(first_cpu - step_cpu)
        out["stages_missing"] = timer.missing
    return out


def measure_cross_cuda(*, model: str, mode: str, small: bool, profile: str | None = None,
                       triton: bool = False) -> dict[str, Any]:
    """Child process: kiln compiling ``model`` for CUDA from this host with fake CUDA inputs.

    ``triton``: the generated Triton kernels are compiled too, for the target the parent set in
    ``KILN_TRITON_CROSS_TARGET`` (cuda:90), on kiln's compile workers as on a GPU; stages are then wall
    seconds (the workers' CPU time is not this process's) and the row waits for every graph's kernels.
    Training traces forward + backward on the CPU (torch's autograd engine needs a real device for
    CUDA tensors) under CPU autocast (bf16), then each of the forward and backward graphs is compiled
    for CUDA (``_retargeting``): the graphs match a GPU AMP trace up to the CPU's autocast policy and
    attention kernel choice."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.kiln_bench.models import build_for_mode, cast_inputs

    training = mode == "training"
    label = mode + (" (cross-cuda + triton)" if triton else " (cross-cuda)")
    result: dict[str, Any] = {"backend": "kiln", "model": model, "mode": label}
    clock = time.perf_counter if triton else cpu_clock
    try:
        kiln = B.import_kiln()
        import kiln.inductor as kiln_inductor
        from kiln.backends import resolve_backend
        from kiln.capture import capture_graph
        from kiln.settings import CompileOptions

        _warm_up("kiln", "cpu")
        case = _build_with_gpu_shapes(build_for_mode, model, small, training)
        if not training:  # what the GPU suite runs
            case.model.to(torch.bfloat16)
            cast_inputs(case, torch.bfloat16)
        made: list[Any] = []
        retarget: list[tuple[float, float]] = []
        kiln_inductor.compile_graph = _retargeting(kiln_inductor.compile_graph, made, training, retarget)
        backend = resolve_backend("inductor", CompileOptions())
        timer = StageTimer(clock).install()
        prof = _profiler(profile)
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if training else contextlib.nullcontext()
        t0, c0 = time.perf_counter(), cpu_clock()
        with prof:
            # cyclic GC paused as kiln.compile pauses it while a frame compiles (capture/optimize.py)
            with torch.set_grad_enabled(training), amp, _gc_paused():
                captured = capture_graph(type(case.model).forward, (case.model, *case.args), case.kwargs)
                t1, c1 = time.perf_counter(), cpu_clock()  # the captured graph's move to CUDA: this benchmark's
                mode_ = FakeTensorMode(allow_non_fake_inputs=True)
                if not training:
                    _to_cuda_graph(captured.gm)
                fakes = [_fake_like(spec, mode_, "cpu" if training else "cuda") for spec in captured.input_specs]
                retarget.append((time.perf_counter() - t1, cpu_clock() - c1))
                if triton and training:  # kiln's backend starts the compile workers on entry when its inputs
                    kiln_inductor.warm_compile_pool("cuda")  # are CUDA; these CPU-traced ones become CUDA later
                backend(captured.gm, fakes)
            python_s, python_cpu = time.perf_counter() - t0, cpu_clock() - c0
            reports = [c.wait_kernels() for c in made if getattr(c, "wait_kernels", None) is not None]
        total, total_cpu = time.perf_counter() - t0, cpu_clock() - c0
        timer.uninstall()
        del kiln
    except Exception as exc:  # noqa: BLE001
        return dict(result, error=B.short_error(exc), details=B.error_details(exc))
    _save_profile(prof, profile, f"kiln-{model}-{mode}-cross-cuda")
    # the CPU-traced graphs' move to CUDA is this benchmark's, not kiln's: left out of every figure
    moved, moved_cpu = sum(w for w, _ in retarget), sum(c for _, c in retarget)
    stages = timer.report(total - moved if triton else total_cpu - moved_cpu)
    out = dict(result, compile_s=round(total - moved, 3), compile_cpu_s=round(total_cpu - moved_cpu, 3),
               stages=stages, stages_missing=timer.missing, graphs=len(made), retarget_s=round(moved, 3),
               python_s=round(python_s - moved, 3), python_cpu_s=round(python_cpu - moved_cpu, 3))
    reports = [r for r in reports if r is not None]
    if reports:
        cpu, longest = sum(r.worker_cpu for r in reports), max(r.longest_cpu for r in reports)
        out["triton"] = {"jobs": sum(r.jobs for r in reports), "compiled": sum(r.compiled for r in reports),
                         "failed": sum(r.failed for r in reports), "in_process": sum(r.in_process for r in reports),
                         "worker_s": round(sum(r.worker_seconds for r in reports), 3),
                         "worker_cpu_s": round(cpu, 3), "longest_cpu_s": round(longest, 3),
                         # a 16-core GPU host (15 workers beside this process), if the workers had been
                         # ready: this process's CPU seconds + the kernels spread over the workers
                         "est_16core_s": round(python_cpu - moved_cpu + max(longest, cpu / 15), 3)}
    return out


def _build_with_gpu_shapes(build_for_mode: Any, model: str, small: bool, training: bool) -> Any:
    """The model built on the CPU with the GPU suite's input shapes (4 x 512 tokens for Llama, not the
    CPU suite's 1 x 128): what the GPU compiles (before session 8 these rows used the CPU shapes;
    ``KILN_BENCH_CPU_SHAPES=1`` still does)."""
    from benchmarks.kiln_bench import models

    if os.environ.get("KILN_BENCH_CPU_SHAPES") == "1":
        return build_for_mode(model, small=small, device=torch.device("cpu"), training=training)
    cpu_shapes = models.SHAPES[("cpu", small)]
    models.SHAPES[("cpu", small)] = models.SHAPES[("cuda", small)]
    try:
        return build_for_mode(model, small=small, device=torch.device("cpu"), training=training)
    finally:
        models.SHAPES[("cpu", small)] = cpu_shapes


def _gc_paused() -> Any:
    try:
        from kiln.graph import gc_paused
    except ImportError:  # pragma: no cover - a kiln without it
        return contextlib.nullcontext()
    return gc_paused()


def _retargeting(compile_graph: Any, made: list[Any], training: bool, spent: list[tuple[float, float]]) -> Any:
    """``compile_graph`` that keeps what it compiled in ``made``; for training it first turns each (CPU
    traced) graph into a CUDA one: device constants, fake CUDA example inputs and values (the seconds
    this takes, which a GPU does not spend, are added to ``spent``: (wall, CPU) seconds)."""
    def compile_for_cuda(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), cpu_clock()
        if training:
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.utils import _pytree as pytree

            _to_cuda_graph(gm)
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            moved: dict[int, Any] = {}  # CPU fake -> its CUDA twin (placeholders' are the example inputs)

            def cuda(v: Any) -> Any:
                if isinstance(v, torch.Tensor) and id(v) not in moved:
                    moved[id(v)] = _fake_like(v, mode, "cuda")
                return moved[id(v)] if isinstance(v, torch.Tensor) else v
            example_inputs = [cuda(x) for x in example_inputs]
            for node in gm.graph.nodes:  # values stay (as the GPU trace gives them): no re-trace
                if "val" in node.meta:
                    node.meta["val"] = pytree.tree_map(cuda, node.meta["val"])
        spent.append((time.perf_counter() - t0, cpu_clock() - c0))
        compiled = compile_graph(gm, example_inputs, **kwargs)
        made.append(compiled)
        return compiled
    return compile_for_cuda


def _fake_like(spec: Any, mode: Any, device: str) -> Any:
    """A fake tensor on ``device`` like ``spec`` (a captured input's TensorSpec or a tensor); ints stay ints."""
    if spec is None or isinstance(spec, int):
        return spec
    stride = spec.stride() if callable(spec.stride) else spec.stride
    with mode:
        t = torch.empty_strided(tuple(int(s) for s in spec.shape), tuple(int(s) for s in stride), dtype=spec.dtype,
                                device=device)
    return t.requires_grad_(bool(spec.requires_grad)) if t.is_floating_point() else t


def _to_cuda_graph(gm: torch.fx.GraphModule) -> None:
    """Device constants the CPU capture baked in (``arange(..., device='cpu')``) become CUDA."""
    def cuda(a: Any) -> Any:
        is_cpu = isinstance(a, torch.device) and a.type == "cpu" or a == "cpu"
        return torch.device("cuda") if is_cpu else a

    for node in gm.graph.nodes:
        node.args = torch.fx.node.map_aggregate(node.args, cuda)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, cuda)
    gm.recompile()


class _NoProfile(contextlib.nullcontext):
    pass


def _profiler(path: str | None) -> Any:
    if not path:
        return _NoProfile()
    import cProfile

    return cProfile.Profile()


def _save_profile(prof: Any, folder: str | None, name: str) -> None:
    if folder and not isinstance(prof, _NoProfile):
        Path(folder).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(Path(folder) / f"{name}.prof"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.set_defaults(backends=["kiln", "torch_compile"])
    p.add_argument("--models", type=cli.csv, default=["bert_base", "gpt2", "vit_base_patch16_224"])
    p.add_argument("--modes", type=cli.csv, default=["inference", "training"])
    p.add_argument("--cross-cuda", action="store_true",
                   help="also compile for CUDA from this host with fake inputs (kiln only; Python side)")
    p.add_argument("--cross-triton", default="",
                   help="implies --cross-cuda: also compile the Triton kernels for this target (cuda:90) on "
                        "kiln's compile workers; stages in wall seconds")
    p.add_argument("--kiln-only", action="store_true", help="measure kiln only (no torch.compile rows)")
    p.add_argument("--profile", default=None, help="folder for cProfile dumps of kiln's first calls")
    p.add_argument("--first-compile", action="store_true",
                   help="no warm-up compile: the model is each process's first compile, as in the suite")
    args = cli.finish(p.parse_args(argv), "compile_time")
    args.cross_cuda = args.cross_cuda or bool(args.cross_triton)
    env = cli.child_env(args)
    backends = [b for b in args.backends if b != "eager" and not (args.kiln_only and b != "kiln")]
    results = []
    for mode in args.modes:
        for model in args.models:
            jobs = [("benchmarks.compile_time:measure",
                     dict(backend=b, model=model, mode=mode, small=args.small, device=args.device,
                          profile=args.profile if b == "kiln" else None,
                          warm_up=not args.first_compile)) for b in backends]
            if args.cross_cuda:
                jobs.append(("benchmarks.compile_time:measure_cross_cuda",
                             dict(model=model, mode=mode, small=args.small, profile=args.profile,
                                  triton=bool(args.cross_triton))))
            for target, kwargs in jobs:
                cross_env = dict(env, KILN_TRITON_CROSS_TARGET=args.cross_triton) if "cross" in target else env
                r = run_isolated(target, kwargs, timeout_s=args.timeout, env=cross_env)
                r.setdefault("backend", kwargs.get("backend", "kiln"))
                r.setdefault("model", model)
                r.setdefault("mode", mode + (" (cross-cuda)" if "cross" in target else ""))
                if r.get("triton"):
                    print(f"    triton: {r['triton']}; Python side {r.get('python_s')} s", flush=True)
                print(f"{r['mode']:<24} {model:<22} {B.LABELS[r['backend']]:<13} "
                      + (na(r["error"], 200) if r.get("error") else f"compile {fmt(r['compile_s'])} s"),
                      flush=True)
                results.append(r)
    info = machine_info(args.device, module="benchmarks.compile_time", threads=args.threads)
    md = write_micro(args.out, "compile_time", "Cold compile time (first call - steady call, seconds)",
                     info, _tables(results, args.small), {"results": results, "small": args.small})
    print("\n" + md)
    return 0


def _tables(results: list[dict], small: bool) -> str:
    keys = sorted({(r["mode"], r["model"]) for r in results}, key=lambda k: (k[0], k[1]))
    main_rows, stage_rows = [], []
    for mode, model in keys:
        rows = {r["backend"]: r for r in results if r["mode"] == mode and r["model"] == model}
        k, t = rows.get("kiln", {}), rows.get("torch_compile", {})
        name = model + (" (small)" if small else "")
        main_rows.append([mode, name, na(k["error"]) if k.get("error") else fmt(k.get("compile_s")),
                          na(t["error"]) if t.get("error") else fmt(t.get("compile_s")),
                          fmt(ratio(k.get("compile_s"), t.get("compile_s"))),
                          fmt(k.get("compile_cpu_s")), fmt(t.get("compile_cpu_s"))])
        if k.get("stages"):
            st = k["stages"]
            stage_rows.append([mode, name, *[fmt(st.get(s)) for s in (*ORDER, "other")]])
    out = markdown_table(["mode", "model", "kiln s", "torch.compile s", "kiln / torch.compile",
                          "kiln CPU s", "torch.compile CPU s"], main_rows)
    out += ("\n\nTarget (issue #6): kiln / torch.compile <= 0.5. CPU s: CPU seconds of the process and "
            "its compiler subprocesses (steadier than wall time on a shared machine; torch.compile's "
            "compile workers are subprocesses it does not wait for, so its CPU s undercounts).\n\n"
            "kiln per stage (CPU seconds, exclusive; wall seconds on rows that compile Triton kernels, "
            "whose workers' CPU time is not this process's):\n\n")
    out += markdown_table(["mode", "model", *ORDER, "other"], stage_rows)
    triton_rows = [[r["mode"], r["model"], str(r.get("graphs")), fmt(r.get("python_s")), fmt(r.get("python_cpu_s")),
                    str(r["triton"]["jobs"]), str(r["triton"]["failed"]), str(r["triton"]["in_process"]),
                    fmt(r["triton"]["worker_cpu_s"]), fmt(r["triton"]["longest_cpu_s"]), fmt(r.get("compile_s")),
                    fmt(r["triton"]["est_16core_s"])] for r in results if r.get("triton")]
    if triton_rows:
        out += ("\n\nTriton kernels compiled ahead (distinct specialisations) on the compile workers. "
                "Python side: capture to the last graph's wrapper (wall / this process's CPU s); worker CPU s: "
                "the kernels' compile CPU seconds (worker + ptxas) summed; longest: the slowest kernel; total: "
                "wall on this host, where the workers share its cores with the compile; 16-core estimate: "
                "Python CPU s + max(longest, worker CPU s / 15):\n\n")
        out += markdown_table(["mode", "model", "graphs", "Python side s", "Python CPU s", "kernels", "failed",
                               "in-process", "worker CPU s", "longest s", "total s (here)", "16-core est. s"],
                              triton_rows)
    return out


if __name__ == "__main__":
    sys.exit(main())
