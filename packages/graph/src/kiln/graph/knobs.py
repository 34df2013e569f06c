"""Environment variables shared by all stages, read once into typed settings (STYLE.md rule 4), and
the declaration of every environment variable kiln reads (``ENVIRONMENT``).

Each package reads its variables in its own ``knobs.py``; they are declared here, in one table, so
that the graph cache (kiln.runtime) can key on the ones that change generated code without
importing the stages that read them. A rule test (tests/test_rules.py) checks that every variable a
``knobs.py`` reads is declared here for that package, and that nothing outside ``knobs.py`` reads
the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable kiln reads: which package reads it, and whether its value can change
    what a graph compiles to (then it is part of the graph cache key)."""

    name: str
    # the packages whose knobs.py reads it; "generated": code kiln generates reads it (wrappers and
    # kernel modules run with kiln-runtime alone, or in torch-free compile workers)
    readers: frozenset[str]
    changes_code: bool


def _vars(readers: str, changes_code: bool, *names: str) -> tuple[EnvVar, ...]:
    return tuple(EnvVar(n, frozenset(readers.split()), changes_code) for n in names)


# Where logs, dumps and caches go, how many processes compile (the same kernels either way), or how a
# captured graph is found: not part of the graph cache key. Everything else is.
ENVIRONMENT: Mapping[str, EnvVar] = {v.name: v for v in (
    *_vars("graph", False, "KILN_LOGS", "KILN_DEBUG_DIR", "KILN_VERIFY", "KILN_UPDATE_GOLDEN"),
    *_vars("capture", True, "KILN_RECOMPILE_LIMIT", "KILN_INLINE_DEPTH"),
    *_vars("autograd", True, "KILN_PARTITIONER", "KILN_RECOMPUTE_NORMS"),
    *_vars("inductor", False, "KILN_INDUCTOR_CACHE_DIR", "KILN_TRITON_COMPILE_WORKERS",
           "KILN_TRITON_WORKER_TORCH", "USER"),
    *_vars("inductor", True, "KILN_INDUCTOR_KEEP_SOURCES", "KILN_CONV_LAYOUT", "KILN_SPLIT_REDUCTIONS", "KILN_PDL", "KILN_PDL_PREFETCH",
           "KILN_AUTOTUNE_BUDGET_S", "KILN_AUTOTUNE_CROSS_TARGET", "KILN_TRITON_CROSS_TARGET",
           "KILN_CUDAGRAPH_EXPANDABLE", "KILN_MEMORY_ARENA", "KILN_GPU_WRAPPER", "KILN_CPU_WRAPPER"),
    *_vars("inductor", False, "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "KILN_TIER_AFTER_CALLS"),
    *_vars("runtime inductor", False, "KILN_CACHE_DIR"),
    *_vars("runtime", False, "KILN_CACHE", "KILN_GRAPH_CACHE", "XDG_CACHE_HOME", "TRITON_CACHE_DIR",
           "TRITON_HOME"),
    *_vars("runtime", True, "KILN_CXX"),
    *_vars("runtime", False, "KILN_TRITON_PRECOMPILE"),  # read when a generated wrapper loads
    *_vars("runtime", False, "KILN_CPP_PCH"),  # the same binaries with or without the precompiled header
    *_vars("runtime", False, "KILN_NATIVE_GUARDS"),  # the same answers, checked in C or in Python
    *_vars("runtime generated", True, "TRITON_INTERPRET"),  # generated: Triton kernel modules
    *_vars("kiln", False, "KILN_REPORT"),  # the meta-package: where compile reports go
)}
_KEYED_PREFIXES = ("KILN_", "TRITON_")


def code_environment(env: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The environment a compiled graph depends on, for cache keys: the declared variables that change
    code, and (to stay sound) every ``KILN_*``/``TRITON_*`` variable not declared at all (triton's own
    settings, a variable added without a declaration). Read now, not at import: a key describes the
    environment the graph is compiled in."""
    e = os.environ if env is None else env
    return tuple(sorted((k, v) for k, v in e.items()
                        if (k in ENVIRONMENT and ENVIRONMENT[k].changes_code)
                        or (k not in ENVIRONMENT and k.startswith(_KEYED_PREFIXES))))


@dataclass(frozen=True, slots=True)
class GraphKnobs:
    logs: str  # KILN_LOGS: comma-separated log names
    debug_dir: Path | None  # KILN_DEBUG_DIR: dump every stage's text form here
    verify: bool  # KILN_VERIFY=1: run the verifier after every pass
    update_golden: bool  # KILN_UPDATE_GOLDEN=1: golden tests rewrite their expected parts (--update-golden)


def read_knobs(env: dict[str, str] | None = None) -> GraphKnobs:
    e = os.environ if env is None else env
    debug = e.get("KILN_DEBUG_DIR")
    return GraphKnobs(
        logs=e.get("KILN_LOGS", ""),
        debug_dir=Path(debug) if debug else None,
        verify=e.get("KILN_VERIFY", "0") not in ("", "0", "false", "False"),
        update_golden=e.get("KILN_UPDATE_GOLDEN", "0") not in ("", "0"),
    )


KNOBS = read_knobs()
