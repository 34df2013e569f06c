"""Build a package's ``model.so``: kiln's kernels and the C++ wrapper as two translation units, compiled
in parallel (the wrapper against libtorch's headers is the slow one), linked into one shared library.

The kernels keep their own flags (``-O3 -march=native -fopenmp ...``: the same code the Python wrapper
loads); the wrapper needs only ``-O2``: it is a straight line of calls.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelBuildError
from .flags import cflags, ldflags

# -O1: the wrapper is a straight line of library calls; -O2 took ~20 % longer to build for nothing
WRAPPER_FLAGS = ("-O1", "-fPIC", "-fvisibility=hidden")


@dataclass(frozen=True)
class BuildReport:
    seconds: float  # wall time of the whole build
    wrapper_seconds: float
    kernels_seconds: float
    library_bytes: int


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], float]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), time.perf_counter()


def _finish(job: tuple[subprocess.Popen[str], float], what: str, source: Path) -> float:
    proc, t0 = job
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise KernelBuildError(f"building {what} failed ({' '.join(proc.args)}):\n{out[-8000:]}\n"  # type: ignore[arg-type]
                               f"source: {source}")
    return time.perf_counter() - t0


def build_model_library(wrapper_source: str, kernel_source: str, out: Path, *, kernel_flags: Sequence[str],
                        link_flags: Sequence[str], cxx: str = "g++", keep_sources: Path | None = None) -> BuildReport:
    """Compile and link ``out`` (model.so). ``keep_sources``: a folder that receives wrapper.cpp and
    kernels.cpp (a package ships them, for reading and for rebuilding on another machine)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-package-") as tmp:
        d = Path(keep_sources) if keep_sources is not None else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        w_src, k_src = d / "wrapper.cpp", d / "kernels.cpp"
        w_src.write_text(wrapper_source)
        objs = [Path(tmp) / "wrapper.o"]
        wrapper = _start([cxx, *cflags(), *WRAPPER_FLAGS, "-c", str(w_src), "-o", str(objs[0])])
        k_seconds = 0.0
        if kernel_source:
            k_src.write_text(kernel_source)
            objs.append(Path(tmp) / "kernels.o")
            kernels = _start([cxx, *kernel_flags, "-fPIC", "-c", str(k_src), "-o", str(objs[1])])
            k_seconds = _finish(kernels, "kiln's kernels", k_src)
        w_seconds = _finish(wrapper, "the C++ wrapper", w_src)
        link = _start([cxx, "-shared", *(f for f in kernel_flags if f == "-fopenmp"), *map(str, objs),
                       "-o", str(out), *ldflags(), *link_flags])
        _finish(link, "model.so", w_src)
    return BuildReport(time.perf_counter() - t0, w_seconds, k_seconds, out.stat().st_size)
