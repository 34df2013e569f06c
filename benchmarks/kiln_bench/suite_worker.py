"""One suite row: one model, one mode, one backend, measured in its own process.

inference: ``model.eval()`` under ``torch.no_grad()``; bf16 weights and inputs on GPU, fp32 on CPU.
training:  forward + loss + backward (gradients zeroed with ``set_to_none``; no optimizer step, so
           weights stay equal to eager's), AMP bf16 (``torch.autocast``) on GPU, fp32 on CPU.

For kiln and torch.compile rows the eager result of the same step is computed first in the same
process (same weights) and moved to CPU, then the outputs (inference) or loss and every parameter's
gradient (training) of the compiled step are compared with it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from . import backends as B
from . import measure as M
from .models import build_for_mode


def _step_fn(case: Any, run: Callable, training: bool, device: torch.device) -> Callable[[], Any]:
    args, kwargs = case.args, case.kwargs
    if not training:
        def infer() -> Any:
            with torch.no_grad():
                return run(*args, **kwargs)
        return infer

    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else contextlib.nullcontext())

    def train() -> Any:
        case.model.zero_grad(set_to_none=True)
        with amp:
            out = run(*args, **kwargs)
            loss = case.loss_fn(out, case.targets)
        loss.backward()
        return loss.detach()
    return train


def _graph_info(backend: str, case: Any, explain: bool, dynamic: bool = False) -> dict[str, Any]:
    try:
        if backend == "kiln" and dynamic:  # kiln.explain would capture again with the default setting
            s = B.import_kiln().stats()
            return {"graphs": int(s.graphs_compiled), "breaks": int(s.graph_breaks),
                    "op_by_op": int(s.graphs_run_eagerly)}
        if backend == "torch_compile":
            if explain:
                torch._dynamo.reset()
                return B.torch_explain(case.model, case.args, case.kwargs)
            return B.torch_compile_counters()
        if backend == "kiln":
            # graphs kiln.inductor did not compile (their ATen graph ran op by op) in this process
            op_by_op = int(B.import_kiln().stats().graphs_run_eagerly)
            return {**B.kiln_explain(case.model, case.args, case.kwargs), "op_by_op": op_by_op}
    except Exception as exc:  # noqa: BLE001 - graph counts are secondary; keep the row
        return {"error": B.short_error(exc, 200)}
    return {}


def measure_rows(*, model: str, mode: str, backends: list[str], device: str, small: bool,
                 iters: int, warmup: int, kiln_backend: str = "inductor",
                 tc_backend: str = "inductor", compile_mode: str | None = None,
                 explain: bool = False, dynamic: bool = False,
                 kiln_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rows for ``backends`` (in order) of one model and mode, built once in this process.

    When "eager" is among them it runs first and its last step is the accuracy reference;
    otherwise one untimed eager step gives the reference. With ``dynamic`` the compilers compile
    with ``dynamic=True`` and their rows are named ``kiln_dynamic``/``torch_compile_dynamic``.
    """
    dev = torch.device(device)
    training = mode == "training"
    t_build = time.perf_counter()
    case = build_for_mode(model, small=small, device=dev, training=training)
    base: dict[str, Any] = {
        "model": model, "mode": mode, "device": device, "batch": case.shape.batch,
        "size": case.shape.size, "params_m": case.n_params() / 1e6,
        "description": case.description,
        "dtype": ("amp-bf16" if training else "bf16") if dev.type == "cuda" else "fp32",
        "build_s": round(time.perf_counter() - t_build, 2),
    }
    spec = B.CompileSpec(kiln_backend=kiln_backend, tc_backend=tc_backend, mode=compile_mode,
                         dynamic=True if dynamic else None, kiln_options=tuple(sorted((kiln_options or {}).items())))
    reference = None
    if "eager" not in backends:
        out = _step_fn(case, case.model, training, dev)()
        reference = _reference(case, out, training)
        del out
    rows = []
    steps: dict[int, Callable[[], Any]] = {}
    for backend in backends:
        row = dict(base, backend=backend)
        step = _measure_backend(row, case, backend, spec, training, dev, iters, warmup, explain,
                                reference)
        if backend == "eager" and "last_out" in row:
            reference = _reference(case, row.pop("last_out"), training)
        row.pop("last_out", None)
        if step is not None:
            steps[len(rows)] = step
        rows.append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if len(steps) > 1 and not explain:
        _interleaved(rows, steps, dev, iters)
    if dynamic:
        for row in rows:
            row["backend"] = f"{row['backend']}_dynamic"
    return {"rows": rows}


def _interleaved(rows: list[dict[str, Any]], steps: dict[int, Callable[[], Any]],
                 dev: torch.device, iters: int, rounds: int = 5) -> None:
    """Time every backend's step again in alternating rounds (A B C A B C ...) and make the median
    of those the row's ``median_ms``. The host of a GPU machine drifts (the same ATen call measured
    13-21 us in one process minutes apart), and host-bound steps drift with it: measured one after
    another, backends would be compared at different host speeds. The one-after-another median is
    kept as ``median_seq_ms``."""
    per_round = max(1, iters // rounds)
    times: dict[int, list[float]] = {i: [] for i in steps}
    try:
        for _ in range(rounds):
            for i, step in steps.items():
                times[i].extend(M.timed_call(step, dev)[0] for _ in range(per_round))
    except Exception as exc:  # noqa: BLE001 - keep the one-after-another medians
        print(f"interleaved timing failed, rows keep their sequential medians: {B.short_error(exc)}")
        return
    for i, ts in times.items():
        row = rows[i]
        row["median_seq_ms"] = row["median_ms"]
        row["median_ms"] = statistics.median(ts) * 1e3
        row["timing"] = f"interleaved, {rounds} rounds x {per_round} steps"


def _reference(case: Any, out: Any, training: bool) -> tuple[list, list | None]:
    ref = (M.to_reference(out), M.grads_of(case.model) if training else None)
    case.model.zero_grad(set_to_none=True)
    return ref


def _measure_backend(row: dict[str, Any], case: Any, backend: str, spec: B.CompileSpec,
                     training: bool, dev: torch.device, iters: int, warmup: int, explain: bool,
                     reference: tuple[list, list | None] | None) -> Callable[[], Any] | None:
    """Compile, check and time one backend into ``row``; its step function when it ran, else None."""
    try:
        run = B.compile_fn(backend, case.model, spec)
        step = _step_fn(case, run, training, dev)
        first_s, out = M.timed_call(step, dev)
    except Exception as exc:  # noqa: BLE001 - the row records the failure
        print(B.error_details(exc))
        row["error"] = B.short_error(exc)
        row["error_stage"] = "compile/first call"
        return None
    try:
        for _ in range(max(0, warmup - 1)):
            step()
        waited = B.wait_tiered(backend, spec.kiln_options)  # seconds still waited after the warm-up calls
        if waited is not None:
            row["tier_wait_s"] = waited
            row["tiers"] = B.settle_tiered(backend, step)  # past the trial, which alternates the two wrappers
        with M.PeakMemory(dev) as mem:
            median = M.median_seconds(step, dev, iters)
            out = step()
            M.sync(dev)
    except Exception as exc:  # noqa: BLE001
        print(B.error_details(exc))
        row["error"] = B.short_error(exc)
        row["error_stage"] = "steady-state calls"
        return None
    row.update(first_call_s=first_s, median_ms=median * 1e3, compile_s=max(0.0, first_s - median),
               peak_mb=mem.mb, mem_kind=mem.kind, iters=iters)
    if backend == "eager":
        row["last_out"] = out
        return step
    if reference is not None:
        row["acc_out"] = M.compare(M.to_reference(out), reference[0]).as_dict()
        if training and reference[1] is not None:
            row["acc_grad"] = M.compare(M.grads_of(case.model), reference[1]).as_dict()
    row["graph_info"] = _graph_info(backend, case, explain, spec.dynamic is True)
    return step
