"""Micro-benchmark (d): warm starts -- compile caches and saved compiled functions.

    uv run python -m benchmarks.warm_start [--small] [--device cpu|cuda] [--models gpt2] [--out DIR]
                                           [--parts cache,load] [--repeat N] [--budget SECONDS]

1. Cold vs warm cache: a fresh process compiles a suite model (inference) with every compiler cache
   (``KILN_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``) pointing at an empty temp
   folder; a second fresh process compiles it again with the same, now warm, folders. Compile time =
   first call - steady call, after one eager step of the model in the same process (so CUDA's
   lazy initialisation is not counted as compile time, as in the suite); the ratio cold / warm is
   reported per backend (target: >= 5x, issue 7).
2. Saved compiled function: one process ``aot_compile``s the model's forward (fullgraph) and saves it;
   a fresh process with empty caches times ``load_compiled_function`` + the first call, against a
   fresh process's first eager call (target: at most 2x eager, issue 7). torch.compile's own
   ``aot_compile`` / ``torch.compiler.load_compiled_function`` is measured beside it, with
   ``guard_filter_fn=torch.compiler.keep_portable_guards_unsafe`` (its default filter keeps
   ID_MATCH guards that cannot be serialised for transformers models).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import cli
from benchmarks.kiln_bench import measure as M
from benchmarks.kiln_bench.isolate import fresh_cache_env, run_isolated
from benchmarks.kiln_bench.models import build, cast_inputs
from benchmarks.kiln_bench.report import fmt, machine_info, markdown_table, na, ratio, write_micro


def _case(model: str, small: bool, device: str) -> Any:
    case = build(model, small=small, device=device)
    case.model.eval()
    if device.startswith("cuda"):
        case.model.to(torch.bfloat16)
        cast_inputs(case, torch.bfloat16)
    return case


# --------------------------------------------------------------------------- children


def compile_seconds(*, backend: str, model: str, small: bool, device: str, kiln_backend: str,
                    tc_backend: str, train: bool = False) -> dict[str, Any]:
    """Child: first call - steady call of the compiled model (caches as the parent set them).
    ``train``: the call is a training step (model in train mode, forward + backward of the sum of
    the outputs), so forward and backward graphs are compiled (or loaded from the cache)."""
    case = _case(model, small, device)
    spec = B.CompileSpec(kiln_backend=kiln_backend, tc_backend=tc_backend)
    lines = _cache_log_lines() if backend == "kiln" else []
    try:
        _eager_once(case, train, device)
        run = B.compile_fn(backend, case.model, spec)
        if train:
            case.model.train()

            def step() -> Any:
                out = run(*case.args, **case.kwargs)
                loss = sum(t.float().sum() for t in M.flatten_tensors(out) if t.requires_grad)
                loss.backward()
                return out
        else:
            def step() -> Any:
                with torch.no_grad():
                    return run(*case.args, **case.kwargs)
        first, _ = M.timed_call(step, device)
        steady = M.median_seconds(step, device, 3)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return {"error": B.short_error(exc)}
    return {"compile_s": max(0.0, first - steady), "first_call_s": first,
            "cache_log": _summarize_cache_log(lines)}


def _eager_once(case: Any, train: bool, device: str) -> None:
    """One eager step first, as the suite does: the CUDA context, cuBLAS/cuDNN handles and the
    allocator's first segments are the process's, not a compile's (both compilers would pay them in
    their first call, and on a GPU they are seconds that no cache removes)."""
    if train:
        case.model.train()
        out = case.model(*case.args, **case.kwargs)
        sum(t.float().sum() for t in M.flatten_tensors(out) if t.requires_grad).backward()
        case.model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            case.model(*case.args, **case.kwargs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _cache_log_lines() -> list[str]:
    """kiln's ``cache`` log lines of this process (graph cache hits/misses, Triton binaries)."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
    logger = logging.getLogger("kiln.cache")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    return lines


def _summarize_cache_log(lines: list[str]) -> str:
    hits = sum(" hit " in f" {ln} " for ln in lines)
    misses = sum("miss" in ln for ln in lines)
    installed = sum("none compiled" in ln for ln in lines)
    stored = sum("Triton binary file" in ln for ln in lines)
    return (f"graph cache: {hits} hit(s), {misses} miss(es); Triton binaries stored for {stored} "
            f"graph(s), installed from the cache for {installed} (those compile no Triton kernel)")


def _aot_compile(backend: str, case: Any, spec: B.CompileSpec) -> Any:
    """The model's forward compiled ahead of time; called as ``compiled(model, *args)``."""
    if backend == "torch_compile":
        # torch's default guard filter keeps ID_MATCH guards that cannot be serialised for HF
        # models ("PackageError: ID_MATCH guard cannot be serialized"); keep portable guards only,
        # as torch's precompile documentation suggests.
        keep = getattr(torch.compiler, "keep_portable_guards_unsafe", None) or getattr(
            torch.compiler, "keep_tensor_guards_unsafe", None)
        options = {"guard_filter_fn": keep} if keep is not None else None
        fn = torch.compile(type(case.model).forward, fullgraph=True, backend=spec.tc_backend,
                           options=options)
        return fn.aot_compile(((case.model, *case.args), case.kwargs))
    kiln = B.import_kiln()
    compiled = kiln.compile(case.model, fullgraph=True, backend=spec.kiln_backend)
    return compiled.forward.aot_compile((case.args, case.kwargs))


def save_artifact(*, backend: str, model: str, small: bool, device: str, path: str,
                  kiln_backend: str, tc_backend: str) -> dict[str, Any]:
    """Child: aot_compile the model's forward and save it to ``path``."""
    case = _case(model, small, device)
    spec = B.CompileSpec(kiln_backend=kiln_backend, tc_backend=tc_backend)
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            compiled = _aot_compile(backend, case, spec)
            compile_s = time.perf_counter() - t0
            out = compiled(case.model, *case.args, **case.kwargs)
            expected = case.model(*case.args, **case.kwargs)
        err = M.compare(M.to_reference(out), M.to_reference(expected))
        compiled.save_compiled_function(path)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return {"error": B.short_error(exc)}
    return {"aot_compile_s": compile_s, "bytes": Path(path).stat().st_size,
            "max_rel": err.max_rel}


def _load(backend: str, path: str) -> Any:
    with open(path, "rb") as f:
        if backend == "torch_compile":
            return torch.compiler.load_compiled_function(f)
        return B.import_kiln().load_compiled_function(f)


def load_first_call(*, backend: str, model: str, small: bool, device: str,
                    path: str | None) -> dict[str, Any]:
    """Child: seconds of load + first call (or of eager's first call when ``path`` is None).

    Imports and building the model happen before the clock starts: both sides have those.
    """
    case = _case(model, small, device)
    if backend != "eager":
        try:
            B.import_kiln() if backend == "kiln" else None
        except B.BackendUnavailable as exc:
            return {"error": str(exc)}
    M.sync(device)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            if backend == "eager":
                out = case.model(*case.args, **case.kwargs)
            else:
                loaded = _load(backend, path)
                out = loaded(case.model, *case.args, **case.kwargs)
            M.sync(device)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        return {"error": B.short_error(exc)}
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        err = M.compare(M.to_reference(out), M.to_reference(case.model(*case.args, **case.kwargs)))
    return {"first_call_s": seconds, "max_rel": err.max_rel}


# --------------------------------------------------------------------------- parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cli.add_common(p)
    p.add_argument("--models", type=cli.csv, default=None,
                   help="suite models (default: gpt2 on CPU; gpt2,resnet50 on GPU)")
    p.add_argument("--parts", type=cli.csv, default=["cache", "load"])
    p.add_argument("--train", action="store_true",
                   help="cache part: time a training step (forward + backward) instead of inference")
    p.add_argument("--warm-env", action="append", default=[], metavar="VAR=VALUE",
                   help="cache part: set VAR=VALUE in the warm processes only (repeatable), e.g. "
                        "KILN_TRITON_COMPILE_WORKERS=0 to time a warm start without Triton compile "
                        "workers importing beside it")
    p.add_argument("--repeat", type=int, default=1,
                   help="fresh processes per measurement (cold/warm pairs, loads); medians are reported")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run: models not started by then are skipped "
                        "(rows say so); one model's phases always finish")
    args = cli.finish(p.parse_args(argv), "warm_start")
    if args.models is None:
        args.models = ["gpt2", "resnet50"] if args.device.startswith("cuda") else ["gpt2"]
    backends = [b for b in args.backends if b != "eager"]
    info = machine_info(args.device, module="benchmarks.warm_start", threads=args.threads)
    common = dict(small=args.small, device=args.device)
    cache_rows, load_rows = [], []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln_warm_") as tmp:
        for model in args.models:
            if args.budget is not None and time.perf_counter() - start > args.budget:
                skipped = {"error": f"skipped: the {args.budget:.0f} s time budget was spent"}
                print(f"{model}: {skipped['error']}", flush=True)
                cache_rows += [{"model": model, "backend": b, "cold": skipped, "ratio": None}
                               for b in backends if "cache" in args.parts]
                if "load" in args.parts:
                    load_rows.append({"model": model, "eager": skipped})
                continue
            if "cache" in args.parts:
                for backend in backends:
                    cache_rows.append(_guarded(lambda b=backend, m=model: _cold_warm(
                        args, b, m, Path(tmp), common), {"model": model, "backend": backend}))
            if "load" in args.parts:
                load_rows.append(_guarded(lambda m=model: _load_row(args, backends, m, Path(tmp), common),
                                          {"model": model}))
    _print_ratios(cache_rows, load_rows, backends)
    body = []
    if cache_rows:
        body.append(_cache_table(cache_rows))
    if load_rows:
        body.append(_load_table(load_rows, backends))
    md = write_micro(args.out, "warm_start", "Warm start: compile cache and saved functions", info,
                     "\n\n".join(body), {"cache": cache_rows, "load": load_rows,
                                         "small": args.small})
    print("\n" + md)
    return 0


def _median_of(n: int, run: Any) -> dict[str, Any]:
    """The result with the median ``first_call_s`` of ``n`` fresh processes (all samples kept):
    one first call is one sample, and on a shared machine one sample is noise."""
    results = [run() for _ in range(max(1, n))]
    good = sorted((r for r in results if not r.get("error")), key=lambda r: r["first_call_s"])
    if not good:
        return results[0]
    out = dict(good[len(good) // 2])
    out["samples_s"] = [round(r["first_call_s"], 4) for r in good]
    return out


def _guarded(run: Any, row: dict[str, Any]) -> dict[str, Any]:
    """One model's row; a failure in the parent (not only in a child) becomes the row's error."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - one model must not stop the others
        print(f"{row}: {B.short_error(exc)}", flush=True)
        error = {"error": B.short_error(exc)}
        return {**row, "cold": error, "ratio": None} if "backend" in row else {**row, "eager": error}


def _print_ratios(cache_rows: list[dict], load_rows: list[dict], backends: list[str]) -> None:
    """The issue's figures, one line each: cold/warm compile (>= 5) and load+first/eager (<= 2)."""
    for r in cache_rows:
        print(f"RATIO cold/warm compile  {r['model']:<20} {B.LABELS[r['backend']]:<13} "
              f"{fmt(r.get('ratio'))}  (target >= 5)")
    for r in load_rows:
        eager = r.get("eager", {}).get("first_call_s")
        for b in backends:
            load = r.get(b, {}).get("load", {})
            warm = r.get(b, {}).get("load_warm", {})
            print(f"RATIO load+first/eager   {r['model']:<20} {B.LABELS[b]:<13} "
                  f"{fmt(ratio(load.get('first_call_s'), eager))} new machine, "
                  f"{fmt(ratio(warm.get('first_call_s'), eager))} warm local cache  (target <= 2)"
                  + (f"  [{na(load['error'], 120)}]" if load.get("error") else ""))


def _cold_warm(args: argparse.Namespace, backend: str, model: str, tmp: Path,
               common: dict) -> dict[str, Any]:
    """Cold then warm compile, ``--repeat`` times (each pair with its own new cache folders); the
    medians are reported, with every sample."""
    kw = dict(backend=backend, model=model, kiln_backend=args.kiln_backend,
              tc_backend=args.tc_backend, train=args.train, **common)
    row: dict[str, Any] = {"model": model, "backend": backend}
    samples: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    for rep in range(max(1, args.repeat)):
        env = dict(fresh_cache_env(tmp / f"cache-{backend}-{model}-{rep}"), **cli.child_env(args))
        for phase in ("cold", "warm"):
            extra = _warm_env(args) if phase == "warm" else {}
            r = run_isolated("benchmarks.warm_start:compile_seconds", kw, timeout_s=args.timeout,
                             env={**env, **extra}, fresh_caches=False)
            samples[phase].append(r)
            print(f"cache {phase:<5} {model:<12} {B.LABELS[backend]:<13} "
                  + (na(r["error"], 200) if r.get("error") else f"compile {fmt(r['compile_s'])} s")
                  + (f"  [{r['cache_log']}]" if r.get("cache_log") else ""), flush=True)
            if r.get("error"):
                break
        if any(r.get("error") for r in samples["cold"] + samples["warm"]):
            break
    for phase in ("cold", "warm"):
        if samples[phase]:
            row[phase] = _median_compile(samples[phase])
    row["ratio"] = ratio(row["cold"].get("compile_s"), row.get("warm", {}).get("compile_s"))
    return row


def _warm_env(args: argparse.Namespace) -> dict[str, str]:
    """--warm-env VAR=VALUE options as a dict (the warm processes' extra environment)."""
    out: dict[str, str] = {}
    for item in getattr(args, "warm_env", None) or []:
        var, sep, value = item.partition("=")
        if not sep or not var:
            raise SystemExit(f"--warm-env expects VAR=VALUE, got {item!r}")
        out[var] = value
    return out


def _median_compile(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = sorted((r for r in results if not r.get("error")), key=lambda r: r["compile_s"])
    if len(good) < len(results):
        return next(r for r in results if r.get("error"))
    out = dict(good[len(good) // 2])
    out["samples_s"] = [round(r["compile_s"], 3) for r in good]
    return out


def _load_row(args: argparse.Namespace, backends: list[str], model: str, tmp: Path,
              common: dict) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model}
    row["eager"] = _median_of(args.repeat, lambda: run_isolated(
        "benchmarks.warm_start:load_first_call", dict(backend="eager", model=model, path=None,
                                                      **common),
        timeout_s=args.timeout, env=cli.child_env(args)))
    print(f"load  {model:<12} eager first call {fmt(row['eager'].get('first_call_s'), 3)} s",
          flush=True)
    for backend in backends:
        path = str(tmp / f"{backend}-{model}.artifact")
        saved = run_isolated("benchmarks.warm_start:save_artifact",
                             dict(backend=backend, model=model, path=path,
                                  kiln_backend=args.kiln_backend, tc_backend=args.tc_backend,
                                  **common), timeout_s=args.timeout, env=cli.child_env(args))
        load_kw = dict(backend=backend, model=model, path=path, **common)
        loaded = saved if saved.get("error") else _median_of(args.repeat, lambda kw=load_kw: run_isolated(
            "benchmarks.warm_start:load_first_call", kw, timeout_s=args.timeout,
            env=cli.child_env(args)))
        # a restart on the same machine: a first load fills the local caches, a second one is timed
        again: dict[str, Any] = {"error": loaded.get("error") or saved.get("error")}
        if not again["error"]:
            env = dict(fresh_cache_env(tmp / f"load-cache-{backend}-{model}"), **cli.child_env(args))
            run_isolated("benchmarks.warm_start:load_first_call", load_kw,  # fills the local cache
                         timeout_s=args.timeout, env=env, fresh_caches=False)
            again = _median_of(args.repeat, lambda kw=load_kw, e=env: run_isolated(
                "benchmarks.warm_start:load_first_call", kw, timeout_s=args.timeout, env=e,
                fresh_caches=False))
        row[backend] = {"save": saved, "load": loaded, "load_warm": again}
        print(f"load  {model:<12} {B.LABELS[backend]:<13} "
              + (na(loaded["error"], 200) if loaded.get("error") else
                 f"load + first call {fmt(loaded['first_call_s'], 3)} s, warm local cache "
                 f"{fmt(again.get('first_call_s'), 3)} s"), flush=True)
    return row


def _cache_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        cold, warm = r["cold"], r.get("warm", {})
        err = cold.get("error") or warm.get("error")
        body.append([r["model"], B.LABELS[r["backend"]],
                     na(err) if err else fmt(cold.get("compile_s")) + _samples(cold),
                     "-" if err else fmt(warm.get("compile_s")) + _samples(warm),
                     fmt(r.get("ratio"))])
    return ("### Compile time, cold vs warm cache (seconds)\n\n" + markdown_table(
        ["model", "backend", "cold s", "warm s", "cold / warm"], body)
        + "\n\nWith --repeat N: medians of N cold/warm pairs (samples in brackets). "
          "Target (issue 7): cold / warm >= 5 for kiln.")


def _samples(r: dict[str, Any]) -> str:
    s = r.get("samples_s") or []
    return f" ({', '.join(f'{x:.2f}' for x in s)})" if len(s) > 1 else ""


def _load_table(rows: list[dict], backends: list[str]) -> str:
    headers = ["model", "eager first call s"]
    for b in backends:
        headers += [f"{B.LABELS[b]} load + first call s", f"{B.LABELS[b]} / eager",
                    f"{B.LABELS[b]} same, warm local cache s", f"{B.LABELS[b]} warm / eager",
                    f"{B.LABELS[b]} artifact KB"]
    body = []
    for r in rows:
        eager = r["eager"].get("first_call_s")
        line = [r["model"], na(r["eager"]["error"]) if r["eager"].get("error") else fmt(eager, 3)]
        for b in backends:
            load = r.get(b, {}).get("load", {})
            size = r.get(b, {}).get("save", {}).get("bytes")
            warm = r.get(b, {}).get("load_warm", {})
            line += [na(load["error"]) if load.get("error") else fmt(load.get("first_call_s"), 3),
                     fmt(ratio(load.get("first_call_s"), eager)),
                     "-" if warm.get("error") else fmt(warm.get("first_call_s"), 3),
                     fmt(ratio(warm.get("first_call_s"), eager)),
                     fmt(size / 1024 if size else None, 0)]
        body.append(line)
    return ("### Saved compiled function: load + first call vs eager first call\n\n"
            + markdown_table(headers, body)
            + "\n\nEach in a fresh process (with --repeat N: the median of N processes); imports "
              "and model building happen before the clock starts. 'load + first call': empty "
              "compile caches (a new machine). 'warm local cache': a later load in a process "
              "restart on the same machine (code objects of the program reused from "
              "KILN_CACHE_DIR, as CPython reuses .pyc files). Target (issue 7): kiln / eager <= 2.")


if __name__ == "__main__":
    sys.exit(main())
