"""Where a saved compiled function's load + first call spends its time (cProfile), one model.

    python -m benchmarks.load_profile save gpt2 /tmp/gpt2.kiln     # process 1: aot_compile + save
    KILN_CACHE_DIR=... TRITON_CACHE_DIR=... \\
        python -m benchmarks.load_profile prof gpt2 /tmp/gpt2.kiln   # process 2, fresh caches = new machine

Prints load s, first call s, how many triton cache lookups, ``triton_key`` calls and gcc builds each
phase made, a second call, then the top functions by cumulative and by own time.

    KILN_CACHE_DIR=$(mktemp -d) python -m benchmarks.load_profile spans mobilenet_v3_large /tmp/m.kiln cpu

prints one line of wall-clock spans of the load (no profiler: cProfile inflates per-call costs several
times): read (load_artifact), plan (CallPlan), materialize, exec (of which compile()), guards (the
check's build), then the first, second and third call, in ms. Run it in fresh processes and take mins
and medians: a new process is what a restart pays.
On CUDA the model is the suite's bf16 inference configuration (``benchmarks.warm_start``).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import warm_start as W
from benchmarks.kiln_bench import backends as B
from benchmarks.kiln_bench import measure as M


def main(argv: list[str]) -> int:
    what, model, path = argv[:3]
    device = argv[3] if len(argv) > 3 else ("cuda" if torch.cuda.is_available() else "cpu")
    if what == "save":
        print(W.save_artifact(backend="kiln", model=model, small=device == "cpu", device=device, path=path,
                              kiln_backend="inductor", tc_backend="inductor"))
        return 0
    case = W._case(model, device == "cpu", device)
    B.import_kiln()
    M.sync(device)
    if what == "spans":
        print(_spans(case, path, device))
        return 0
    counting = _work_counter()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    with torch.no_grad():
        with counting() as load_work:
            loaded = W._load("kiln", path)
        t1 = time.perf_counter()
        with counting() as call_work:
            loaded(case.model, *case.args, **case.kwargs)
            M.sync(device)
    prof.disable()
    t2 = time.perf_counter()
    print(f"load {t1 - t0:.3f} s, first call {t2 - t1:.3f} s, total {t2 - t0:.3f}")
    # what triton did in each phase: a load of an artifact built on this GPU and triton release should
    # show none of it (binaries handed to triton's kernel cache, launchers shipped)
    print(f"load:       {load_work.as_text()}")
    print(f"first call: {call_work.as_text()}")
    _launchers_shipped(loaded, [*getattr(load_work, "details", []), *getattr(call_work, "details", [])])
    t3 = time.perf_counter()
    with torch.no_grad():
        loaded(case.model, *case.args, **case.kwargs)
        M.sync(device)
    print(f"second call {time.perf_counter() - t3:.4f} s")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    print("\n".join(line[:200] for line in out.getvalue().splitlines()))
    return 0


def _spans(case, path: str, device: str) -> str:
    """Wall-clock spans (ms) of a load + three calls, timed by wrapping kiln.runtime's steps."""
    import builtins

    import kiln.runtime.code_cache as code_cache
    import kiln.runtime.loaded as loaded_mod

    spans: dict[str, float] = {}

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spans[label] = spans.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)

    timed(loaded_mod, "load_artifact", "read")
    timed(loaded_mod.CallPlan, "for_artifact", "plan")
    timed(loaded_mod, "_materialize", "materialize")
    timed(loaded_mod, "exec_program", "exec")
    timed(loaded_mod, "compile_guards", "guards")
    code_cache.compile = builtins.compile  # the name code_cache calls: time it there
    timed(code_cache, "compile", "compile()")
    with open(path, "rb") as f:
        data = f.read()
    marks = [time.perf_counter()]
    with torch.no_grad():
        loaded = B.import_kiln().load_compiled_function(io.BytesIO(data))
        marks.append(time.perf_counter())
        for _ in range(3):
            loaded(case.model, *case.args, **case.kwargs)
            M.sync(device)
            marks.append(time.perf_counter())
    spans.update(load=marks[1] - marks[0], first=marks[2] - marks[1], second=marks[3] - marks[2],
                 third=marks[4] - marks[3], total=marks[2] - marks[0])
    return " ".join(f"{k}={v * 1e3:.2f}" for k, v in spans.items())


def _launchers_shipped(loaded, details: list[str]) -> None:
    """How many C launchers (triton <= 3.6) the artifact carries, and for each gcc build above whether the
    folder it went to was one of them (yes: the shipped file was not used; no: it was never shipped)."""
    files = getattr(getattr(loaded, "artifact", None), "files", None) or {}
    shipped = {name.split("/")[1] for name in files if name.startswith("triton/") and "__triton_launcher" in name}
    print(f"artifact:   {len(shipped)} C launcher(s) shipped")
    for line in details:
        if "gcc build" in line and "-> triton/" in line:
            folder = line.rsplit("-> triton/", 1)[1].strip("/ ")
            print(f"    {folder[:16]}...: {'in the artifact' if folder in shipped else 'NOT in the artifact'}")


def _work_counter():
    """kiln.runtime's counter of triton cache lookups / triton_key / gcc builds, or a stand-in that
    says it is missing (an older kiln.runtime)."""
    import contextlib

    try:
        from kiln.runtime.triton_preload import count_triton_work
        return count_triton_work
    except ImportError:
        class Unknown:
            def as_text(self) -> str:
                return "(kiln.runtime has no count_triton_work)"

        @contextlib.contextmanager
        def unknown():
            yield Unknown()
        return unknown


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
