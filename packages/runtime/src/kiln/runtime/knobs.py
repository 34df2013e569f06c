"""Environment variables of kiln.runtime, read once into typed settings (STYLE.md rule 4).

KILN_CACHE_DIR   root of the compile cache (default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln)
KILN_CACHE=0     disable the on-disk compile cache (everything is rebuilt, nothing written)
KILN_GRAPH_CACHE=0  skip the graph-level cache (captured graph -> compiled program)
KILN_CXX         the C++ compiler for CPU kernels (default: g++)
KILN_CPP_PCH=0   build C++ kernels without their precompiled header (kiln.runtime.cpp; same binaries, slower)
KILN_NATIVE_GUARDS=0  check guards in Python, not with the native checker (kiln.runtime.native_guards)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class RuntimeKnobs:
    cache_dir: Path
    cache_enabled: bool
    cxx: str
    graph_cache: bool = True
    cpp_pch: bool = True
    native_guards: bool = True


def default_cache_dir(env: Mapping[str, str]) -> Path:
    explicit = env.get("KILN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kiln"


def read_knobs(env: Mapping[str, str] | None = None) -> RuntimeKnobs:
    e = os.environ if env is None else env
    return RuntimeKnobs(
        cache_dir=default_cache_dir(e),
        cache_enabled=e.get("KILN_CACHE", "1") not in ("0", "false", "False", "off"),
        cxx=e.get("KILN_CXX", "g++"),
        graph_cache=e.get("KILN_GRAPH_CACHE", "1") not in ("0", "false", "False", "off"),
        cpp_pch=e.get("KILN_CPP_PCH", "1") not in ("0", "false", "False", "off"),
        native_guards=e.get("KILN_NATIVE_GUARDS", "1") not in ("0", "false", "False", "off"),
    )


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton runs kernels on CPU tensors through its interpreter. Read on use,
    not at import: triton reads it itself when it compiles (tests set it before triton loads, after
    kiln is imported), and kiln must agree with triton at that moment."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_precompile() -> bool:
    """KILN_TRITON_PRECOMPILE=0: a generated wrapper does not compile its Triton kernels together
    when it loads (each compiles at its first launch). Read when a wrapper loads."""
    return os.environ.get("KILN_TRITON_PRECOMPILE", "1") != "0"


def triton_cache_dir_from_env() -> Path:
    """Triton's cache folder as its environment says (TRITON_CACHE_DIR, else TRITON_HOME/.triton/cache):
    read on use, as triton does, so a test or a launcher that sets it late is followed."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    return Path(os.environ.get("TRITON_HOME", os.path.expanduser("~"))) / ".triton" / "cache"


KNOBS = read_knobs()
