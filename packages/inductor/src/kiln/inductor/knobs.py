"""Environment variables of kiln.inductor, read once (STYLE.md rule 4)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime.knobs import triton_interpret

__all__ = ["KNOBS", "InductorKnobs", "read_knobs", "triton_interpret", "worker_environment"]


@dataclass(frozen=True, slots=True)
class InductorKnobs:
    cache_dir: Path  # autotune results: KILN_INDUCTOR_CACHE_DIR (else KILN_CACHE_DIR/inductor, else temp)
    keep_sources: bool  # KILN_INDUCTOR_KEEP_SOURCES=1 keeps .cpp next to the .so in the cache
    conv_layout: str  # KILN_CONV_LAYOUT: InductorOptions.conv_layout's default (auto|channels_last|keep)
    split_reductions: bool = True  # KILN_SPLIT_REDUCTIONS=0: InductorOptions.split_reductions's default
    pdl: bool = True  # KILN_PDL=0: InductorOptions.pdl's default (programmatic dependent launch)
    pdl_prefetch: bool = False  # KILN_PDL_PREFETCH=1: InductorOptions.pdl_prefetch's default (weights into L2)
    # max-autotune: seconds one compile may spend tuning, after which choices keep their defaults
    autotune_budget_s: float = 60.0  # KILN_AUTOTUNE_BUDGET_S
    # KILN_AUTOTUNE_CROSS_TARGET=cuda:90: without a device, compile every candidate for that target
    # (compile-only: nothing is timed, choices keep their defaults) to measure what tuning would compile
    autotune_cross_target: str = ""
    # KILN_TRITON_COMPILE_WORKERS: processes of the one Triton compile pool (compile_pool.py), compiling a
    # graph's kernels and max-autotune's candidates; -1 (unset): one a core, at most 32; 0: compile in this
    # process (the wrapper's thread pool; max-autotune's candidates on threads)
    triton_compile_workers: int = -1
    # KILN_TRITON_CROSS_TARGET=cuda:90: without a GPU, compile the generated Triton kernels of CUDA graphs
    # for that target anyway (what a GPU cold compile costs, measured on a CPU host; nothing runs)
    triton_cross_target: str = ""
    # KILN_TRITON_WORKER_TORCH=1: compile workers import torch (by default they compile without it, which
    # starts them faster); a way back should a triton need torch to compile
    triton_worker_torch: bool = False
    # KILN_CUDAGRAPH_EXPANDABLE=0: a backward recording (which frees the saved activations it takes over as it
    # goes) allocates in fixed-size pool segments, as every other recording does (cudagraphs/engine.py)
    cudagraph_expandable: bool = True
    # KILN_MEMORY_ARENA=0: kiln.compile's reduce-overhead inference graphs allocate one block per buffer
    # as before, not one arena (InductorOptions.memory_arena)
    memory_arena: bool = True
    # KILN_GPU_WRAPPER (python|cpp|tiered): the wrapper kiln.compile gives a CUDA graph (inference or
    # training) in default mode when options do not name one ("wrapper"); tiered: the Python wrapper at
    # once, the C++ one built in the background (tiered.py)
    gpu_wrapper: str = "tiered"
    # KILN_CPU_WRAPPER (python|cpp|tiered): the same for a CPU graph (inference or training) in default mode;
    # tiered there starts the C++ wrapper's build after KILN_TIER_AFTER_CALLS calls of the graph
    cpu_wrapper: str = "tiered"
    tier_after_calls: int = 50
    alloc_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF (else PYTORCH_ALLOC_CONF): the user's allocator settings


def read_knobs(env: dict[str, str] | None = None) -> InductorKnobs:
    e = os.environ if env is None else env
    if e.get("KILN_INDUCTOR_CACHE_DIR"):
        cache = Path(e["KILN_INDUCTOR_CACHE_DIR"])
    elif e.get("KILN_CACHE_DIR"):
        cache = Path(e["KILN_CACHE_DIR"]) / "inductor"
    else:
        user = e.get("USER") or str(os.getuid())
        cache = Path(tempfile.gettempdir()) / f"kiln-inductor-{user}"
    return InductorKnobs(cache_dir=cache, keep_sources=e.get("KILN_INDUCTOR_KEEP_SOURCES", "1") != "0",
                         conv_layout=e.get("KILN_CONV_LAYOUT", "auto"),
                         split_reductions=e.get("KILN_SPLIT_REDUCTIONS", "1") != "0",
                         pdl=e.get("KILN_PDL", "1") != "0",
                         pdl_prefetch=e.get("KILN_PDL_PREFETCH", "0") == "1",
                         autotune_budget_s=_float(e.get("KILN_AUTOTUNE_BUDGET_S"), 60.0, "KILN_AUTOTUNE_BUDGET_S"),
                         autotune_cross_target=e.get("KILN_AUTOTUNE_CROSS_TARGET", ""),
                         triton_compile_workers=int(_float(e.get("KILN_TRITON_COMPILE_WORKERS"), -1,
                                                           "KILN_TRITON_COMPILE_WORKERS")),
                         triton_cross_target=e.get("KILN_TRITON_CROSS_TARGET", ""),
                         triton_worker_torch=e.get("KILN_TRITON_WORKER_TORCH", "0") == "1",
                         cudagraph_expandable=e.get("KILN_CUDAGRAPH_EXPANDABLE", "1") != "0",
                         memory_arena=e.get("KILN_MEMORY_ARENA", "1") != "0",
                         gpu_wrapper=_choice(e.get("KILN_GPU_WRAPPER"), "tiered", "KILN_GPU_WRAPPER",
                                             ("python", "cpp", "tiered")),
                         cpu_wrapper=_choice(e.get("KILN_CPU_WRAPPER"), "tiered", "KILN_CPU_WRAPPER",
                                             ("python", "cpp", "tiered")),
                         tier_after_calls=int(_float(e.get("KILN_TIER_AFTER_CALLS"), 50, "KILN_TIER_AFTER_CALLS")),
                         alloc_conf=e.get("PYTORCH_CUDA_ALLOC_CONF") or e.get("PYTORCH_ALLOC_CONF") or "")


def worker_environment() -> dict[str, str]:
    """The environment of a compile worker process: this one's, unbuffered, without the interpreter
    (workers compile for the GPU)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    return env


def _float(text: str | None, default: float, name: str) -> float:
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None


def _choice(text: str | None, default: str, name: str, choices: tuple[str, ...]) -> str:
    if not text:
        return default
    if text not in choices:
        raise ValueError(f"{name}={text!r}: expected one of {', '.join(choices)}")
    return text


KNOBS = read_knobs()
