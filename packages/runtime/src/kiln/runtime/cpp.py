"""C++ kernels for generated code: build shared libraries with g++ and load them with ctypes.

Libraries are cached by a hash of (source, flags, compiler, host CPU) — ``-march=native`` output is
only valid on a CPU with the same instructions — and loaded from a content-addressed file. A binary
that does not load on this machine is rebuilt from its source when one is given.

Note: the precompiled header. Parsing the standard headers a generated translation unit starts with
(<cmath>, <algorithm>: ~29,000 lines) was ~80% of g++'s time on a small kernel library (0.41 of 0.51
CPU-s measured). A source whose leading part ends with the line ``PCH_END`` has that part precompiled
once per (text, flags, compiler, host) into the compile cache (``cpp_pch``) and compiled as
``#include "kiln_header.h"`` + the rest (a ``#line`` keeps the line numbers): 0.19 CPU-s for that
library, the same bytes out (GCC's PCH is a snapshot of the parse; checked by a test). A header g++
cannot precompile, or a .gch it refuses (``-Winvalid-pch``), is logged and the source built as a whole.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .cache import CompileCache, default_cache, key_hash
from .environment import current_host
from .errors import KernelBuildError
from .knobs import KNOBS

logger = logging.getLogger("kiln.runtime")

CXX_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
PCH_END = "// kiln: the precompiled header ends here\n"  # a source's leading part up to this line is precompiled
PCH_NAME = "kiln_header.h"
_LOADED: dict[str, ctypes.CDLL] = {}  # sha256 of the binary -> handle (dlopen is once per file)
_PCH_REFUSED: set[str] = set()  # headers (by key) the compiler could not precompile in this process
_PCH_FILES: dict[str, Path] = {}  # header key -> this process's copy of its .gch


class _PchDir:
    """The folder of this process's copies of precompiled headers (made on first use, removed at exit):
    its own, so a concurrent ``kiln cache clear`` cannot take a .gch from under a running g++."""

    path: Path | None = None


_PCH_DIR = _PchDir()


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
                link_flags: Sequence[str] = (), pch: bool | None = None) -> bytes:
    """Compile C++ source to a shared library's bytes (cached in namespace 'cpp_so').

    ``link_flags`` (libraries such as ``-lm``) go after the source and output, where the linker
    needs them. Concurrent builders of one source wait for each other (one g++ run). ``pch``: use the
    precompiled header of a source with a ``PCH_END`` line (default: KILN_CPP_PCH, on)."""
    cxx = cxx or KNOBS.cxx
    all_flags = (*flags, *extra_flags)
    cache = cache or default_cache()
    key = cpp_cache_key(source, all_flags, cxx, link_flags)
    use_pch = KNOBS.cpp_pch if pch is None else pch
    return cache.get_or_build("cpp_so", key, lambda: _run_compiler(source, all_flags, cxx, tuple(link_flags),
                                                                   cache if use_pch else None))


def precompiled_header(header: str, flags: Sequence[str], cxx: str, cache: CompileCache) -> Path | None:
    """``header`` precompiled by ``cxx`` with ``flags`` (those of the translation units that include it;
    link-only flags dropped): a file of this process's own (the compile cache's entry, read and verified
    once per process, ~20 MB: not once per library), built into the cache when it has none; None, logged
    once per process, when the compiler cannot precompile it."""
    pch_flags = tuple(dict.fromkeys(f for f in flags if f not in ("-shared", "-c")))  # a repeated flag is one
    key = cpp_cache_key(header, pch_flags, cxx) + ":pch"
    if key in _PCH_REFUSED:
        return None
    path = _PCH_FILES.get(key)
    if path is not None and path.is_file():
        return path
    try:
        data = cache.get_or_build("cpp_pch", key, lambda: _build_pch(header, pch_flags, cxx))
    except KernelBuildError as e:
        _PCH_REFUSED.add(key)
        logger.info("C++ kernels build without a precompiled header: %s", e)
        return None
    if _PCH_DIR.path is None or not _PCH_DIR.path.is_dir():
        _PCH_DIR.path = Path(tempfile.mkdtemp(prefix="kiln-pch-"))
        atexit.register(shutil.rmtree, _PCH_DIR.path, True)
    path = _PCH_DIR.path / f"{key_hash(key)}.gch"
    path.write_bytes(data)
    _PCH_FILES[key] = path
    return path


def _build_pch(header: str, flags: Sequence[str], cxx: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kiln-pch-") as tmp:
        src = Path(tmp) / PCH_NAME
        src.write_text(header)
        out = Path(tmp) / f"{PCH_NAME}.gch"
        _check(_compile([cxx, *flags, "-x", "c++-header", str(src), "-o", str(out)], cxx), "precompiling the header")
        return out.read_bytes()


def translation_unit(source: str, folder: Path, name: str, flags: Sequence[str], cxx: str,
                     cache: CompileCache | None) -> tuple[Path, list[str]]:
    """Write ``source`` into ``folder`` as ``name`` for g++ with ``flags``; returns its path and the flags to
    add. With a ``cache`` and a ``PCH_END`` line, the part before it is included from its precompiled
    header (written beside it) and the file holds the rest; else the source as it is. The file keeps
    ``name``, so the object is the same bytes either way (it records the file's name)."""
    path = folder / name
    end = source.find(PCH_END) if cache is not None else -1
    gch = precompiled_header(source[:end + len(PCH_END)], flags, cxx, cache) if cache is not None and end >= 0 \
        else None
    if gch is None:
        path.write_text(source)
        return path, []
    header = source[:end + len(PCH_END)]
    (folder / PCH_NAME).write_text(header)
    try:
        (folder / f"{PCH_NAME}.gch").symlink_to(gch)
    except OSError:  # no symlinks here: a copy
        shutil.copyfile(gch, folder / f"{PCH_NAME}.gch")
    path.write_text(f'#include "{PCH_NAME}"\n#line {header.count(chr(10)) + 1} "{name}"\n' + source[len(header):])
    return path, ["-Winvalid-pch"]


def pch_not_used(stderr: str) -> str | None:
    """The compiler's reason for not using the precompiled header (``-Winvalid-pch``), if it said one."""
    lines = [ln for ln in stderr.splitlines() if f"{PCH_NAME}.gch" in ln]
    return "; ".join(lines)[:500] if lines else None


def _compile(cmd: list[str], cxx: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as e:
        raise KernelBuildError(f"C++ compiler {cxx!r} not found; install g++ or set KILN_CXX") from e
    except subprocess.TimeoutExpired as e:
        raise KernelBuildError(f"C++ compilation timed out after 600 s: {' '.join(cmd)}") from e


def _check(proc: subprocess.CompletedProcess[str], what: str = "C++ compilation") -> None:
    if proc.returncode != 0:
        raise KernelBuildError(f"{what} failed ({' '.join(map(str, proc.args))}):\n{proc.stderr.strip()[-4000:]}")


def _run_compiler(source: str, flags: Sequence[str], cxx: str, link_flags: Sequence[str] = (),
                  pch_cache: CompileCache | None = None) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as tmp:
        out = Path(tmp) / "kernel.so"
        src, extra = translation_unit(source, Path(tmp), "kernel.cpp", flags, cxx, pch_cache)
        proc = _compile([cxx, *flags, *extra, str(src), "-o", str(out), *link_flags], cxx)
        if extra and proc.returncode != 0:  # with the precompiled header: once more as a whole source
            logger.warning("C++ kernels failed to build with their precompiled header; building the whole "
                           "source:\n%s", proc.stderr.strip()[-2000:])
            src, extra = translation_unit(source, Path(tmp), "kernel.cpp", flags, cxx, None)
            proc = _compile([cxx, *flags, str(src), "-o", str(out), *link_flags], cxx)
        elif extra and (reason := pch_not_used(proc.stderr)):
            logger.info("C++ kernels built without their precompiled header: %s", reason)
        _check(proc)
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
        # written again if another process clears the cache before dlopen opened it
        lib = cache.with_file("cpp_lib", data, ".so", lambda path: ctypes.CDLL(str(path)))
    else:
        path = Path(binary)
        digest = "path:" + str(path.resolve())
        if digest in _LOADED:
            return _LOADED[digest]
        lib = ctypes.CDLL(str(path))
    _LOADED[digest] = lib
    return lib
