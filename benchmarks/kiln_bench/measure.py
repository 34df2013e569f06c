"""Timing, memory and accuracy measurement shared by the suite and the micro-benchmarks."""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_call(fn: Callable[[], Any], device: torch.device | str) -> tuple[float, Any]:
    """Seconds for one call of ``fn`` (synchronised on GPU) and its result."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def median_seconds(fn: Callable[[], Any], device: torch.device | str, iters: int) -> float:
    """Median of ``iters`` individually timed calls (each synchronised on GPU)."""
    return statistics.median(timed_call(fn, device)[0] for _ in range(max(1, iters)))


def us_per_call(fn: Callable[[], Any], *, calls: int, repeats: int) -> float:
    """Micro-benchmark timer: min over ``repeats`` of the mean time of ``calls`` back-to-back calls.

    The minimum over repeats is the usual choice for overhead figures: noise only adds time.
    """
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory over a region.

    GPU: ``torch.cuda.max_memory_allocated`` (absolute, so weights and inputs are included).
    CPU: increase of the process's peak RSS over its RSS at the start of the region (Linux VmHWM,
    reset through /proc/self/clear_refs); tracemalloc does not see tensor memory. ``None`` where the
    platform offers neither.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.mb: float | None = None
        self.kind = "cuda max_memory_allocated" if self.device.type == "cuda" else "cpu peak RSS delta"
        self._base_kb: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets VmHWM to the current RSS
                self._base_kb = _proc_status_kb("VmRSS")
            except OSError:
                self._base_kb = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.mb = torch.cuda.max_memory_allocated() / 2**20
        elif self._base_kb is not None:
            hwm = _proc_status_kb("VmHWM")
            self.mb = None if hwm is None else max(0, hwm - self._base_kb) / 1024


def _proc_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"{key}:\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- accuracy


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """All tensors in a (nested) output: tensors, tuples/lists, dicts and HF ModelOutputs."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # includes transformers.ModelOutput
        return [t for v in value.values() for t in flatten_tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def to_reference(value: Any) -> list[torch.Tensor]:
    """Detached fp32 CPU copies of every tensor in ``value`` (kept across the timed region)."""
    return [t.detach().float().cpu() if t.is_floating_point() else t.detach().cpu()
            for t in flatten_tensors(value)]


@dataclass(frozen=True, slots=True)
class Error:
    """Worst error of a list of tensors against references.

    ``max_abs``: max |a - b| over all elements. ``max_rel``: max over tensors of
    max|a - b| / max|b| (relative to the tensor's scale, so near-zero elements do not blow up).
    ``count_mismatch`` is set when the number or shapes of tensors differ.
    """

    max_abs: float
    max_rel: float
    n: int
    count_mismatch: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel, "n": self.n,
                "mismatch": self.count_mismatch}


def compare(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> Error:
    if len(actual) != len(expected):
        return Error(math.inf, math.inf, 0, f"{len(actual)} tensors vs {len(expected)} in eager")
    max_abs = max_rel = 0.0
    for a, b in zip(actual, expected):
        if a.shape != b.shape:
            return Error(math.inf, math.inf, 0, f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
        a64, b64 = a.double(), b.double()
        if a64.numel() == 0:
            continue
        diff = (a64 - b64).abs().max().item()
        scale = b64.abs().max().item()
        if math.isnan(diff):
            diff = math.inf
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return Error(max_abs, max_rel, len(actual))


def grads_of(model: torch.nn.Module) -> list[torch.Tensor]:
    """fp32 CPU copies of every parameter's gradient (zeros where a parameter got none)."""
    return [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().cpu()
            for p in model.parameters() if p.requires_grad]
