"""Compiler and linker flags for C++ programs that run kiln packages: libtorch from the installed torch
wheel (its headers and libraries) and kiln's runtime headers (``kiln/runner.h``, header-only).

Found without importing torch (``importlib.util.find_spec``): ``python -m kiln.runtime.cxx`` prints
them in a few tens of milliseconds, inside a ``$(...)`` of a build line.

CUDA (``cuda=True``, ``--cuda``): the CUDA headers c10's CUDA headers include (``cuda_runtime_api.h``)
and the driver API's (``cuda.h``), from the nvidia-* wheels torch depends on (``site-packages/nvidia/*/include``)
or, for what they lack, the copy triton ships; and libtorch_cuda + libc10_cuda, linked even when the
program calls nothing of theirs (``--no-as-needed``): loading them registers ATen's CUDA kernels. The
CUDA driver (libcuda.so.1) is not linked: kiln's CUDA support opens it at run time, as torch and triton
do, so packages and programs build on machines without a GPU driver (CI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import KernelBuildError

INCLUDE_DIR = Path(__file__).parent / "include"

# Only the libraries a CPU program needs: libtorch_cpu (ATen's operators) and libc10; libtorch.so is a
# thin shim that also pulls in the CUDA libraries of a CUDA wheel (loading them costs ~0.3 s)
CPU_LIBS = ("torch_cpu", "c10")
CUDA_LIBS = ("torch_cuda", "c10_cuda")
CUDA_HEADERS = ("cuda_runtime_api.h", "crt/host_defines.h", "cuda.h")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def torch_dir() -> Path:
    d = _package_dir("torch")
    if d is None:
        raise KernelBuildError("kiln.runtime.cxx: torch is not installed in this environment; the C++ runner "
                               "builds against the torch wheel's headers and libraries")
    return d


def cuda_include_dirs() -> list[Path]:
    """Folders holding the CUDA headers a CUDA build needs (``CUDA_HEADERS``): the first of the nvidia-*
    wheels' include folders, then triton's copy, that holds all of them (the runtime's headers include
    their ``crt/`` folder, which some wheels lack), else each header's first; KernelBuildError naming
    what is missing."""
    site = torch_dir().parent
    candidates = sorted(p for p in (site / "nvidia").glob("*/include") if p.is_dir())
    triton = _package_dir("triton")
    if triton is not None:
        candidates.append(triton / "backends" / "nvidia" / "include")
    complete = next((d for d in candidates if all((d / h).exists() for h in CUDA_HEADERS)), None)
    if complete is not None:
        return [complete]
    chosen: list[Path] = []
    for header in CUDA_HEADERS:
        found = next((d for d in candidates if (d / header).exists()), None)
        if found is None:
            raise KernelBuildError(f"kiln.runtime.cxx: no {header} in this environment (looked in "
                                   f"{', '.join(map(str, candidates)) or site / 'nvidia'}); CUDA packages build "
                                   "against the CUDA headers of torch's nvidia-* wheels or triton's copy")
        if found not in chosen:
            chosen.append(found)
    return chosen


def cuda_libraries_present() -> bool:
    lib = torch_dir() / "lib"
    return all((lib / f"lib{name}.so").exists() for name in CUDA_LIBS)


def cflags(cuda: bool = False) -> list[str]:
    t = torch_dir()
    flags = ["-std=c++20", f"-I{INCLUDE_DIR}", f"-I{t / 'include'}",
             f"-I{t / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    return flags + [f"-I{d}" for d in cuda_include_dirs()] if cuda else flags


def ldflags(cuda: bool = False) -> list[str]:
    lib = torch_dir() / "lib"
    flags = [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    if cuda:
        if not cuda_libraries_present():
            raise KernelBuildError(f"kiln.runtime.cxx: this torch ({lib}) has no CUDA libraries "
                                   f"({', '.join('lib' + n + '.so' for n in CUDA_LIBS)}): install a CUDA build of torch")
        flags += ["-Wl,--no-as-needed", *(f"-l{name}" for name in CUDA_LIBS), "-Wl,--as-needed"]
    return [*flags, *(f"-l{name}" for name in CPU_LIBS), "-ldl"]
