"""Compile a C++ translation unit into a shared library through kiln.runtime's compile cache.

One cache implementation for all of kiln: the library's bytes live in the runtime ``CompileCache``
(checksummed, atomic, 0700, concurrent builders wait on a lock), keyed by source, flags, compiler
and host CPU; the in-process copy the wrapper dlopens is a content-addressed folder holding the
``.so`` and its ``.cpp`` (the wrapper rebuilds from the ``.cpp`` when the library does not load).
"""

from __future__ import annotations

import time
from pathlib import Path

import kiln.runtime as runtime
from kiln.graph import KilnError

from ...options import InductorOptions


class CppCompileError(KilnError):
    """g++ rejected generated code: a kiln bug; the message holds the compiler's output and the source."""


def build_shared_library(source: str, options: InductorOptions) -> tuple[bytes, Path, float]:
    """Return (the .so's bytes, the cache folder holding it and its .cpp, seconds spent building or
    loading it from the cache). The bytes are the build's own: another process may clear the cache
    folder at any time (the wrapper loads the bytes, the folder is its fallback)."""
    t0 = time.perf_counter()
    try:
        data = runtime.compile_cpp(source, flags=options.cpp_flags, link_flags=options.link_flags,
                                   cxx=options.cxx)
    except runtime.KernelBuildError as e:
        raise CppCompileError(f"{e}\nThis is a kiln bug (or a missing C++ compiler: set "
                              "InductorOptions(cxx=...)); please report it with the source above.") from e
    key = runtime.cpp_cache_key(source, options.cpp_flags, options.cxx, options.link_flags)
    name = f"k_{key[:32]}"
    folder = runtime.default_cache().materialize_tree(
        "cpp_build", key, {f"{name}.so": data, f"{name}.cpp": source.encode()})
    return data, folder / f"{name}.so", time.perf_counter() - t0
