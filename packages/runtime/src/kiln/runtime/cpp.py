"""C++ kernels for generated code: build shared libraries with g++ and load them with ctypes.

Libraries are cached by a hash of (source, flags, compiler, host CPU) — ``-march=native`` output is
only valid on a CPU with the same instructions — and loaded from a content-addressed file. A binary
that does not load on this machine is rebuilt from its source when one is given.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .cache import CompileCache, default_cache
from .environment import current_host
from .errors import KernelBuildError
from .knobs import KNOBS

logger = logging.getLogger("kiln.runtime")

CXX_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_LOADED: dict[str, ctypes.CDLL] = {}  # sha256 of the binary -> handle (dlopen is once per file)


@functools.cache
def compiler_id(cxx: str) -> str:
    """The first line of ``cxx --version`` (part of the cache key), or '' if it does not run."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def cpp_cache_key(source: str, flags: Sequence[str], cxx: str, link_flags: Sequence[str] = ()) -> str:
    host = current_host()
    h = hashlib.sha256()
    for part in (source, " ".join(flags), " ".join(link_flags), cxx, compiler_id(cxx), host.machine,
                 " ".join(sorted(host.cpu_flags))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_cpp(source: str, *, flags: Sequence[str] = CXX_FLAGS, extra_flags: Sequence[str] = (),
                cxx: str | None = None, cache: CompileCache | None = None,
                link_flags: Sequence[str] = ()) -> bytes:
    """Compile C++ source to a shared library's bytes (cached in namespace 'cpp_so').

    ``link_flags`` (libraries such as ``-lm``) go after the source and output, where the linker
    needs them. Concurrent builders of one source wait for each other (one g++ run)."""
    cxx = cxx or KNOBS.cxx
    all_flags = (*flags, *extra_flags)
    cache = cache or default_cache()
    key = cpp_cache_key(source, all_flags, cxx, link_flags)
    return cache.get_or_build("cpp_so", key,
                              lambda: _run_compiler(source, all_flags, cxx, tuple(link_flags)))


def _run_compiler(source: str, flags: Sequence[str], cxx: str, link_flags: Sequence[str] = ()) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as tmp:
        src, out = Path(tmp) / "kernel.cpp", Path(tmp) / "kernel.so"
        src.write_text(source)
        cmd = [cxx, *flags, str(src), "-o", str(out), *link_flags]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except FileNotFoundError as e:
            raise KernelBuildError(f"C++ compiler {cxx!r} not found; install g++ or set KILN_CXX") from e
        except subprocess.TimeoutExpired as e:
            raise KernelBuildError(f"C++ compilation timed out after 600 s: {' '.join(cmd)}") from e
        if proc.returncode != 0:
            raise KernelBuildError(f"C++ compilation failed ({' '.join(cmd)}):\n"
                                   f"{proc.stderr.strip()[-4000:]}")
        return out.read_bytes()


def load_cpp_library(binary: bytes | str | os.PathLike | None = None, *, source: str | None = None,
                     name: str = "kernel", flags: Sequence[str] = CXX_FLAGS,
                     cache: CompileCache | None = None) -> ctypes.CDLL:
    """Load a C++ shared library from bytes or a path; rebuild it from ``source`` if that fails.

    Generated code calls ``load_cpp_library(FILES.get('k0.so'), source=FILES['k0.cpp'].decode())``;
    a loader leaves the binary out of FILES when it was built for another CPU, and it is rebuilt.
    """
    cache = cache or default_cache()
    if binary is not None:
        try:
            return _dlopen(binary, cache)
        except OSError as e:
            if source is None:
                raise KernelBuildError(f"C++ kernel {name!r} does not load on this machine ({e}) and "
                                       "there is no source to rebuild it from; recompile") from e
            logger.warning("C++ kernel %r does not load here (%s); rebuilding it from source", name, e)
    elif source is None:
        raise KernelBuildError(f"C++ kernel {name!r}: neither a binary nor a source was given")
    assert source is not None
    rebuilt = compile_cpp(source, flags=flags, cache=cache)
    try:
        return _dlopen(rebuilt, cache)
    except OSError as e:
        raise KernelBuildError(f"C++ kernel {name!r} was rebuilt from source but still does not "
                               f"load: {e}") from e


def _dlopen(binary: bytes | str | os.PathLike, cache: CompileCache) -> ctypes.CDLL:
    if isinstance(binary, (bytes, bytearray, memoryview)):
        data = bytes(binary)
        digest = hashlib.sha256(data).hexdigest()
        if digest in _LOADED:
            return _LOADED[digest]
        path = cache.materialize("cpp_lib", data, ".so")
    else:
        path = Path(binary)
        digest = "path:" + str(path.resolve())
        if digest in _LOADED:
            return _LOADED[digest]
    lib = ctypes.CDLL(str(path))
    _LOADED[digest] = lib
    return lib
