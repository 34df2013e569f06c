"""Build a package's ``model.so`` from three objects: kiln's kernels, the generated C++ wrapper, and
``model_support.cpp`` (kiln/model_support.h's libtorch side).

Why three: the wrapper includes no torch header, so it compiles in a fraction of a second; the one
translation unit that includes ATen (slow: ~4-7 s of g++ on this host) is the support file, compiled once
per (source, torch release, compiler, flags) and kept in the compile cache (``cxx_support``). The
kernels keep their own flags (``-O3 -march=native -fopenmp ...``: the same code the Python wrapper
loads). Kernels and wrapper compile in parallel, then the support object (when not cached).

A CUDA package has no kernel object (its kernels are cubins beside model.so) and links a second support
object, ``model_support_cuda.cpp`` (the driver API and torch's CUDA streams; cached the same way).
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache import default_cache
from ..cpp import compiler_id
from ..errors import KernelBuildError
from .flags import INCLUDE_DIR, cflags, ldflags

SUPPORT_SOURCE = Path(__file__).parent / "model_support.cpp"
SUPPORT_HEADER = INCLUDE_DIR / "kiln" / "model_support.h"
# CUDA packages: cubins loaded and launched through the driver API (kiln/model_support_cuda.h)
CUDA_SUPPORT_SOURCE = Path(__file__).parent / "model_support_cuda.cpp"
CUDA_SUPPORT_HEADERS = (INCLUDE_DIR / "kiln" / "model_support_cuda.h", INCLUDE_DIR / "kiln" / "detail" / "sha256.h")
OBJECT_FLAGS = ("-O2", "-fPIC", "-fvisibility=hidden")


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
    return time.perf_counter() - t0


def support_object(cxx: str, cuda: bool = False) -> tuple[Path, float]:
    """The compiled ``model_support.cpp`` (``cuda``: ``model_support_cuda.cpp``), from the compile cache
    when it has it, and seconds spent building."""
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
    cache = default_cache()
    data = cache.get_or_build("cxx_support", h.hexdigest(), build)
    return cache.materialize("cxx_support", data, suffix=".o"), spent


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
        if kernel_source:
            k_src.write_text(kernel_source)
            objs.append(Path(tmp) / "kernels.o")
            kernels = _start([cxx, *kernel_flags, "-fPIC", "-c", str(k_src), "-o", str(objs[1])])
        w_seconds = _finish(wrapper, "the C++ wrapper", w_src)
        k_seconds = _finish(kernels, "kiln's kernels", k_src) if kernels else 0.0
        support, s_seconds = support_object(cxx)  # after them: their times stay their own
        supports = [support]
        if cuda:
            cuda_support, cuda_seconds = support_object(cxx, cuda=True)
            supports.append(cuda_support)
            s_seconds += cuda_seconds
        link = _start([cxx, "-shared", *(f for f in kernel_flags if f == "-fopenmp"), *map(str, objs),
                       *map(str, supports), "-o", str(out), *ldflags(cuda=cuda), *link_flags])
        _finish(link, "model.so", w_src)
    return BuildReport(time.perf_counter() - t0, w_seconds, k_seconds, s_seconds, out.stat().st_size)
