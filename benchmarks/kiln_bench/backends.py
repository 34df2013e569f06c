"""The three things every benchmark compares: eager, kiln and torch.compile.

kiln is imported lazily, per row. If ``import kiln`` or ``kiln.compile`` fails the row records
``n/a (<reason>)`` -- it is never replaced by eager.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

BACKENDS: tuple[str, ...] = ("eager", "kiln", "torch_compile")
LABELS = {"eager": "eager", "kiln": "kiln", "torch_compile": "torch.compile",
          "kiln_dynamic": "kiln dynamic=True", "torch_compile_dynamic": "torch.compile dynamic=True"}


class BackendUnavailable(RuntimeError):
    """kiln (or a torch.compile backend) cannot be used for this row; the message says why."""


def short_error(exc: BaseException, limit: int = 300) -> str:
    """One line naming the exception type and message, cut to ``limit`` characters."""
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " | ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_details(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]


def import_kiln() -> Any:
    """The kiln meta-package, or BackendUnavailable saying why not."""
    try:
        import kiln
    except Exception as exc:  # noqa: BLE001 - any import failure makes the row n/a
        raise BackendUnavailable(f"import kiln failed: {short_error(exc)}") from exc
    if not callable(getattr(kiln, "compile", None)):
        raise BackendUnavailable(
            "kiln.compile is missing: the kiln meta-package is not merged/installed yet")
    return kiln


@dataclass(frozen=True, slots=True)
class CompileSpec:
    """How to compile: which kiln/torch.compile backend, and the mode (None = default)."""

    kiln_backend: Any = "inductor"
    tc_backend: Any = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    kiln_options: tuple[tuple[str, Any], ...] = ()  # kiln.compile(options=...), e.g. (("wrapper", "cpp"),)


def compile_fn(backend: str, fn: Callable, spec: CompileSpec) -> Callable:
    """``fn`` compiled by ``backend`` ("eager" returns it unchanged).

    Compilation itself is lazy in both compilers: errors may surface on the first call, which the
    callers catch and record the same way.
    """
    if backend == "eager":
        return fn
    if backend == "kiln":
        kiln = import_kiln()
        kwargs: dict[str, Any] = {"backend": spec.kiln_backend, "fullgraph": spec.fullgraph,
                                  "dynamic": spec.dynamic}
        if spec.mode is not None:
            kwargs["mode"] = spec.mode
        if spec.kiln_options:
            kwargs["options"] = dict(spec.kiln_options)
        try:
            return kiln.compile(fn, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(f"kiln.compile failed: {short_error(exc)}") from exc
    if backend == "torch_compile":
        kwargs = {"backend": spec.tc_backend, "fullgraph": spec.fullgraph, "dynamic": spec.dynamic}
        if spec.mode is not None and spec.tc_backend == "inductor":
            kwargs["mode"] = spec.mode
        return torch.compile(fn, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")


def reset(backend: str) -> None:
    """Drop in-process compile caches of ``backend`` (between micro-benchmark cases)."""
    if backend == "torch_compile":
        torch._dynamo.reset()
    elif backend == "kiln":
        try:
            kiln = import_kiln()
        except BackendUnavailable:
            return
        if callable(getattr(kiln, "reset", None)):
            kiln.reset()


def identity_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
    """A backend that runs the captured graph as is: measures capture + guard overhead only."""
    return gm.forward


class RecordingBackend:
    """Identity backend that keeps the graphs and example inputs it was given."""

    def __init__(self) -> None:
        self.graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward


# --------------------------------------------------------------------------- graph breaks


def torch_compile_counters() -> dict[str, Any]:
    """Graph and break counts torch.compile accumulated in this process (cheap, no re-trace)."""
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    return {"graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
            "breaks": int(sum(breaks.values())),
            "reasons": [str(r)[:200] for r in list(breaks)[:5]]}


def torch_explain(fn: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    return {"graphs": int(out.graph_count), "breaks": int(out.graph_break_count),
            "reasons": [str(getattr(r, "reason", r))[:200] for r in out.break_reasons[:5]]}


_COUNT_NAMES = {
    "graphs": ("graph_count", "num_graphs", "n_graphs", "graphs"),
    "breaks": ("graph_break_count", "break_count", "num_breaks", "n_breaks", "breaks"),
    "reasons": ("break_reasons", "breaks", "reasons"),
}


def kiln_explain(fn: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Graph and break counts from ``kiln.explain(fn)(*args)``, read defensively (API settling)."""
    kiln = import_kiln()
    explain = getattr(kiln, "explain", None)
    if explain is None:
        capture = getattr(kiln, "capture", None)
        explain = getattr(capture, "explain", None)
    if explain is None:
        raise BackendUnavailable("kiln.explain is missing")
    out = explain(fn)(*args, **kwargs)
    result: dict[str, Any] = {}
    for key, names in _COUNT_NAMES.items():
        for name in names:
            value = out.get(name) if isinstance(out, dict) else getattr(out, name, None)
            if value is None:
                continue
            if key == "reasons":
                if isinstance(value, (list, tuple)):
                    result[key] = [str(getattr(r, "reason", r))[:200] for r in value[:5]]
                    break
                continue
            if isinstance(value, (list, tuple)):
                value = len(value)
            if isinstance(value, int):
                result[key] = value
                break
    if "breaks" not in result:
        result["note"] = f"could not read a break count from {type(out).__name__}"
    return result


def wait_tiered(backend: str, kiln_options: Any = None) -> float | None:
    """With kiln's tiered wrapper (``options={"wrapper": "tiered"}``, and kiln.compile's default for CUDA
    inference graphs and CPU graphs), wait for its background C++ wrapper builds, so that timed calls run
    the upgraded graphs; the seconds waited, else None (no tiered graph). The builds of CPU graphs, which
    start once a graph has been called KILN_TIER_AFTER_CALLS times, start now (the steady state of a
    loop that runs longer than the benchmark). ``settle_tiered`` then runs the trial."""
    if backend != "kiln":
        return None
    from kiln.inductor import build_tiered_now
    from kiln.inductor import wait_tiered as wait
    from kiln.inductor.tiered import live_tiered

    if not live_tiered():
        return None
    build_tiered_now()
    t0 = time.perf_counter()
    wait(600)
    return time.perf_counter() - t0


def settle_tiered(backend: str, step: Callable[[], Any], limit: int = 200,
                  exclude: frozenset[int] = frozenset()) -> dict[str, int] | None:
    """Call ``step`` until no tiered graph is still in its trial (the calls that alternate between the
    Python and the C++ wrapper once the library is loaded: timing them would mix both); how many graphs
    settled on each wrapper ("cpp", "python"; "trial": built but not called by ``step`` since, such as a
    static graph a symbolic one replaced), else None (no tiered graph). ``exclude``: ids of graphs that are
    not ``step``'s (another model's in the same process)."""
    if backend != "kiln":
        return None
    from kiln.inductor.tiered import live_tiered

    calls = [c for c in live_tiered() if id(c) not in exclude]
    if not calls:
        return None

    def trial_calls() -> int:  # calls the trials have timed so far (a graph ``step`` no longer calls stays put)
        return sum(len(t) for c in calls if c.tier == "trial" for t in c._times)  # noqa: SLF001

    for _ in range(limit):
        if all(c.ready.is_set() and c.tier != "trial" for c in calls):
            break
        before = trial_calls()
        step()
        if all(c.ready.is_set() for c in calls) and trial_calls() == before:
            break  # the graphs still in their trial are not called by ``step`` (superseded by a symbolic one)
    tiers = [c.tier for c in calls]
    return {t: tiers.count(t) for t in sorted(set(tiers))}
