"""Build a package's ``model.so`` from three objects: kiln's kernels, the generated C++ wrapper, and
``model_support.cpp`` (kiln/model_support.h's libtorch side).

Why three: the wrapper includes no torch header, so it compiles in a fraction of a second; the one
translation unit that includes ATen (slow: ~22 CPU-s of g++ 12, three quarters of it parsing and
instantiating ATen/core/dispatch/Dispatcher.h and ATen/core/Tensor.h) is the support file, compiled once
per (source, torch release, compiler, flags) and kept in the compile cache (``cxx_support``). The
kernels keep their own flags (``-O3 -march=native -fopenmp ...``: the same code the Python wrapper
loads) and their prelude's precompiled header (kiln.runtime.cpp). Kernels and wrapper compile in
parallel, then the support object (when not cached). The objects cached are copied into the build's own
folder before the link: another process may clear the cache meanwhile.

A CUDA package has no kernel object (its kernels are cubins beside model.so) and links a second support
object, ``model_support_cuda.cpp`` (the driver API and torch's CUDA streams; cached the same way).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache import default_cache
from ..cpp import compiler_id, pch_not_used, translation_unit
from ..errors import KernelBuildError
from ..knobs import KNOBS
from .flags import INCLUDE_DIR, cflags, ldflags

SUPPORT_SOURCE = Path(__file__).parent / "model_support.cpp"
SUPPORT_HEADER = INCLUDE_DIR / "kiln" / "model_support.h"
# CUDA packages: cubins loaded and launched through the driver API (kiln/model_support_cuda.h)
CUDA_SUPPORT_SOURCE = Path(__file__).parent / "model_support_cuda.cpp"
CUDA_SUPPORT_HEADERS = (INCLUDE_DIR / "kiln" / "model_support_cuda.h", INCLUDE_DIR / "kiln" / "detail" / "sha256.h")
OBJECT_FLAGS = ("-O2", "-fPIC", "-fvisibility=hidden")

logger = logging.getLogger("kiln.runtime")


@dataclass(frozen=True)
class BuildReport:
    seconds: float  # wall time of the whole build
    wrapper_seconds: float
    kernels_seconds: float
    support_seconds: float  # 0 when the compile cache had it
    library_bytes: int


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], float]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), time.perf_counter()


def _finish(job: tuple[subprocess.Popen[str], float], what: str, source: Path) -> float:
    proc, t0 = job
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise KernelBuildError(f"building {what} failed ({' '.join(map(str, proc.args))}):\n"  # type: ignore[arg-type]
                               f"{out[-8000:]}\nsource: {source}")
    if reason := pch_not_used(out):
        logger.info("%s built without its precompiled header: %s", what, reason)
    return time.perf_counter() - t0


def _start_kernels(cxx: str, source: str, flags: Sequence[str], folder: Path,
                   pch: bool) -> tuple[subprocess.Popen[str], float, Path, bool]:
    """g++ on kiln's kernels (``folder``/kernels.cpp), with their precompiled header when ``pch``."""
    folder.mkdir(exist_ok=True)
    src, extra = translation_unit(source, folder, "kernels.cpp", flags, cxx, default_cache() if pch else None)
    proc, t0 = _start([cxx, *flags, *extra, "-c", str(src), "-o", str(folder / "kernels.o")])
    return proc, t0, src, bool(extra)


def _finish_kernels(cxx: str, source: str, flags: Sequence[str], folder: Path,
                    job: tuple[subprocess.Popen[str], float, Path, bool]) -> float:
    proc, t0, src, with_pch = job
    try:
        return _finish((proc, t0), "kiln's kernels", src)
    except KernelBuildError as e:
        if not with_pch:
            raise
        logger.warning("kiln's kernels failed to build with their precompiled header; building the whole "
                       "source: %s", e)
        proc, _, src, _ = _start_kernels(cxx, source, flags, folder, pch=False)
        _finish((proc, t0), "kiln's kernels", src)
        return time.perf_counter() - t0


def support_object(cxx: str, cuda: bool = False) -> tuple[bytes, float]:
    """The compiled ``model_support.cpp`` (``cuda``: ``model_support_cuda.cpp``), from the compile cache
    when it has it, and seconds spent building. Bytes, not a path in the cache: another process may clear
    the cache before the link reads it (the caller writes them beside its other objects)."""
    source = CUDA_SUPPORT_SOURCE if cuda else SUPPORT_SOURCE
    headers = (SUPPORT_HEADER, *(CUDA_SUPPORT_HEADERS if cuda else ()))
    flags = [*cflags(cuda=cuda), *OBJECT_FLAGS]
    h = hashlib.sha256()
    for part in (source.read_bytes(), *(p.read_bytes() for p in headers), torch.__version__.encode(),
                 cxx.encode(), compiler_id(cxx).encode(), " ".join(flags).encode()):
        h.update(part + b"\0")
    spent = 0.0

    def build() -> bytes:
        nonlocal spent
        with tempfile.TemporaryDirectory(prefix="kiln-support-") as tmp:
            out = Path(tmp) / "model_support.o"
            spent = _finish(_start([cxx, *flags, "-c", str(source), "-o", str(out)]),
                            "kiln's model support library" + (" (CUDA)" if cuda else ""), source)
            return out.read_bytes()
    return default_cache().get_or_build("cxx_support", h.hexdigest(), build), spent


def build_model_library(wrapper_source: str, kernel_source: str, out: Path, *, kernel_flags: Sequence[str],
                        link_flags: Sequence[str], cxx: str = "g++", keep_sources: Path | None = None,
                        cuda: bool = False) -> BuildReport:
    """Compile and link ``out`` (model.so). ``keep_sources``: a folder that receives wrapper.cpp and
    kernels.cpp (a package ships them, for reading and for rebuilding on another machine). ``cuda``: the
    wrapper launches cubins (kiln/model_support_cuda.h): the CUDA support object and libraries are linked."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-package-") as tmp:
        d = Path(keep_sources) if keep_sources is not None else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        w_src, k_src = d / "wrapper.cpp", d / "kernels.cpp"
        w_src.write_text(wrapper_source)
        objs = [Path(tmp) / "wrapper.o"]
        wrapper = _start([cxx, "-std=c++20", f"-I{INCLUDE_DIR}", *OBJECT_FLAGS, "-c", str(w_src), "-o", str(objs[0])])
        kernels = None
        k_src.unlink(missing_ok=True)  # a package written over an older one keeps no stale source
        k_flags, k_dir = [*kernel_flags, "-fPIC"], Path(tmp) / "kernels"
        if kernel_source:
            k_src.write_text(kernel_source)
            objs.append(k_dir / "kernels.o")
            kernels = _start_kernels(cxx, kernel_source, k_flags, k_dir, KNOBS.cpp_pch)
        w_seconds = _finish(wrapper, "the C++ wrapper", w_src)
        k_seconds = _finish_kernels(cxx, kernel_source, k_flags, k_dir, kernels) if kernels else 0.0
        support, s_seconds = support_object(cxx)  # after them: their times stay their own
        supports = [Path(tmp) / "model_support.o"]
        supports[0].write_bytes(support)
        if cuda:
            cuda_support, cuda_seconds = support_object(cxx, cuda=True)
            supports.append(Path(tmp) / "model_support_cuda.o")
            supports[1].write_bytes(cuda_support)
            s_seconds += cuda_seconds
        link = _start([cxx, "-shared", *(f for f in kernel_flags if f == "-fopenmp"), *map(str, objs),
                       *map(str, supports), "-o", str(out), *ldflags(cuda=cuda), *link_flags])
        _finish(link, "model.so", w_src)
    return BuildReport(time.perf_counter() - t0, w_seconds, k_seconds, s_seconds, out.stat().st_size)
