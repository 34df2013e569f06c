"""Peak live tensor memory of eager vs kiln vs torch.compile, on CPU, as a CUDA caching allocator
would count it (``torch.cuda.max_memory_allocated``: the bytes of live storages, weights included).

A ``TorchDispatchMode`` sees every tensor an op creates (the wrapper's ``torch.empty_strided``,
extern calls, fallbacks); each new storage is counted until its Python object dies (a weakref
finalizer). What was alive before the step (weights, inputs, anything a compiled object keeps) is the
baseline, found with ``gc``. The peak is baseline + the most bytes live at once during the step. At
the peak the probe lists the largest live buffers: the wrapper line that allocated each (its name
and the kernel or extern) for kiln, the ATen op for eager.

``--static-cuda`` also cross-compiles each model for fake CUDA inputs (the GPU path: padded
matmuls, fused attention, channels-last) and walks the generated schedule's allocations and frees
for a static peak, next to eager's peak under fake CUDA tensors (the same probe over FakeTensorMode).

    python benchmarks/memory_probe.py --models vit_base_patch16_224,bert_base,gpt2 --small
    python benchmarks/memory_probe.py --models gpt2 --training --small
    python benchmarks/memory_probe.py --models vit_base_patch16_224 --device cuda --backends eager,kiln,torch_compile
    python benchmarks/memory_probe.py --models gpt2 --small --static-cuda   # + benchmarks/memory_static.py

torch.compile has no CPU row (dynamo runs frames eagerly while a dispatch mode is active); with
``--device cuda`` every backend also gets torch.cuda's own figures (allocated before the step and
``max_memory_allocated``), which is where memory a backend keeps between calls shows up.
"""

from __future__ import annotations

import argparse
import gc
import linecache
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the wrapper is then compiled here, under a filename whose source linecache knows (the breakdown
# names the wrapper line that allocated each buffer)
os.environ.setdefault("KILN_GRAPH_CACHE", "0")

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MB = 2**20


@dataclass(slots=True)
class Live:
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    origin: str


def _origin(op: object) -> str:
    """The kiln wrapper line that made this tensor (``buf3 = torch.empty_strided(...)``), else the op."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith("<kiln"):
            line = linecache.getline(name, f.f_lineno).strip() or f"line {f.f_lineno}"
            return f"{name[1:-1].split()[-1]}: {line[:110]}"
        f = f.f_back
    return str(op)


def _storage_key(t: torch.Tensor) -> tuple[str, int, int] | None:
    try:
        s = t.untyped_storage()
        if s.device.type == "meta":  # fake tensors: the storage object is the identity
            return (str(t.device), 0, id(s))
        return (str(t.device), s.data_ptr(), id(s))
    except Exception:  # noqa: BLE001 - sparse / nested tensors: not counted
        return None


@dataclass
class LiveBytes(TorchDispatchMode):
    """Counts bytes of storages created under the mode while they are alive; records the peak."""

    live: dict[tuple, Live] = field(default_factory=dict)
    current: int = 0
    peak: int = 0
    at_peak: list[Live] = field(default_factory=list)
    keep_snapshots: bool = True
    fake_ok: bool = True
    known: set = field(default_factory=set)  # storages alive before the mode: views of them are free

    def __post_init__(self) -> None:
        super().__init__()

    def _track(self, t: torch.Tensor, origin: str) -> None:
        key = _storage_key(t)
        if key is None or key in self.live or key in self.known:
            return
        s = t.untyped_storage()
        n = s.nbytes()
        self.live[key] = Live(n, tuple(t.shape), t.dtype, origin)
        self.current += n
        weakref.finalize(s, self._free, key)
        if self.current > self.peak:
            self.peak = self.current
            if self.keep_snapshots:
                self.at_peak = list(self.live.values())

    def _free(self, key: tuple) -> None:
        e = self.live.pop(key, None)
        if e is not None:
            self.current -= e.nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        origin = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                if origin is None:
                    origin = _origin(func)
                self._track(t, origin)
        return out


def live_storages() -> dict[tuple, int]:
    """The distinct storages (key -> bytes) of all real tensors the process holds: weights, inputs,
    anything a compiled object keeps (fake and meta tensors have meta storages: not counted)."""
    seen: dict[tuple, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if type(o) is torch.Tensor or type(o) is torch.nn.Parameter or type(o) is torch.nn.Buffer:
                    s = o.untyped_storage()
                    if s.device.type != "meta":
                        seen[(str(o.device), s.data_ptr(), id(s))] = s.nbytes()
            except Exception:  # noqa: BLE001 - objects that fail attribute access
                continue
    return seen


@dataclass(slots=True)
class Peak:
    baseline: int
    step_peak: int
    at_peak: list[Live]

    @property
    def total(self) -> int:
        return self.baseline + self.step_peak


def measure(step: Callable[[], Any], warmup: int = 2, earlier: frozenset = frozenset()) -> Peak:
    """Peak of one steady-state ``step()`` (its result dropped), after ``warmup`` calls; storages in
    ``earlier`` (alive before the model was built: other models of the same run) are not counted."""
    for _ in range(warmup):
        out = step()
        del out
    gc.collect()
    before = live_storages()
    mode = LiveBytes(known=set(before))
    with mode:
        out = step()
    del out
    return Peak(sum(n for k, n in before.items() if k not in earlier), mode.peak, sorted(mode.at_peak, key=lambda e: -e.nbytes))


def breakdown(p: Peak, top: int) -> str:
    lines = [f"    {e.nbytes / MB:9.3f} MB  {str(tuple(e.shape)):<24} {str(e.dtype)[6:]:<9} {e.origin}"
             for e in p.at_peak[:top]]
    return "\n".join(lines)


def _build(name: str, small: bool, training: bool, device: str = "cpu") -> Any:
    from benchmarks.kiln_bench.models import build_for_mode
    return build_for_mode(name, small=small, device=torch.device(device), training=training)


def _step(case: Any, run: Callable, training: bool, device: str = "cpu") -> Callable[[], Any]:
    from benchmarks.kiln_bench.suite_worker import _step_fn
    step = _step_fn(case, run, training, torch.device(device))
    if device == "cpu":
        return step

    def synced() -> Any:
        out = step()
        torch.cuda.synchronize()
        return out
    return synced


def _cuda_peak(step: Callable[[], Any]) -> tuple[float, float]:
    """(MB allocated before a step, torch.cuda.max_memory_allocated over it) after warm-up."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = step()
    del out
    return before / MB, torch.cuda.max_memory_allocated() / MB


def probe_model(name: str, *, small: bool, training: bool, backends: list[str], top: int,
                device: str = "cpu") -> None:
    from benchmarks.kiln_bench import backends as B
    gc.collect()
    earlier = frozenset(live_storages())
    case = _build(name, small, training, device)
    dtype = "fp32" if device == "cpu" else ("amp-bf16" if training else "bf16")
    print(f"## {name} ({'training' if training else 'inference'}, "
          f"batch {case.shape.batch} x {case.shape.size}, {dtype} {device})")
    cuda_rows: dict[str, tuple[float, float]] = {}
    results: dict[str, Peak] = {}
    for backend in backends:
        try:
            run = B.compile_fn(backend, case.model, B.CompileSpec())
            step = _step(case, run, training, device)
            results[backend] = measure(step, earlier=earlier)
            if device == "cuda":  # the allocator's own figure, next to the probe's
                cuda_rows[backend] = _cuda_peak(step)
        except Exception as exc:  # noqa: BLE001 - a row per backend, failures included
            print(f"  {backend}: failed: {type(exc).__name__}: {str(exc)[:300]}")
        if backend == "torch_compile":
            torch._dynamo.reset()
    for backend, p in results.items():
        if backend == "torch_compile" and device == "cpu":
            print("  torch_compile  (no probe figure: dynamo runs eagerly under a dispatch mode)")
            continue
        print(f"  {backend:<14} peak {p.total / MB:9.1f} MB  (before the step {p.baseline / MB:8.1f} MB, "
              f"step {p.step_peak / MB:8.1f} MB; {p.baseline} + {p.step_peak} bytes)")
    for backend, (before, peak) in cuda_rows.items():
        print(f"  {backend:<14} torch.cuda: {before:9.1f} MB allocated before the step, "
              f"max_memory_allocated {peak:9.1f} MB")
    for backend in ("eager", "kiln"):
        if backend in results:
            print(f"  {backend}'s largest live buffers at its peak:\n{breakdown(results[backend], top)}")
    if "eager" in results and "kiln" in results:
        verdict = "OK" if results["kiln"].total <= results["eager"].total else "OVER"
        delta = results["kiln"].total - results["eager"].total
        print(f"  kiln / eager = {results['kiln'].total / results['eager'].total:.3f} ({delta:+d} bytes)  {verdict}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_base_patch16_224,bert_base,gpt2")
    ap.add_argument("--small", action="store_true", help="tiny configs of the same architectures")
    ap.add_argument("--training", action="store_true", help="forward + backward step")
    # torch.compile is no row on CPU: dynamo runs frames eagerly while a dispatch mode is active, and
    # inductor's wrapper allocates outside the dispatcher; on --device cuda its torch.cuda row counts
    ap.add_argument("--backends", default="eager,kiln")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16 inference / AMP training)")
    ap.add_argument("--static-cuda", action="store_true",
                    help="also cross-compile for fake CUDA inputs and print the static peak estimate")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    for name in a.models.split(","):
        probe_model(name, small=a.small, training=a.training, backends=a.backends.split(","), top=a.top,
                    device=a.device)
        if a.static_cuda:
            from benchmarks.memory_static import probe_static_cuda
            probe_static_cuda(name, small=a.small, top=a.top)


if __name__ == "__main__":
    main()
