"""Compiler and linker flags for C++ programs that run kiln packages: libtorch from the installed torch
wheel (its headers and libraries) and kiln's runtime headers (``kiln/runner.h``, header-only).

Found without importing torch (``importlib.util.find_spec``): ``python -m kiln.runtime.cxx`` prints
them in a few tens of milliseconds, inside a ``$(...)`` of a build line.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import KernelBuildError

INCLUDE_DIR = Path(__file__).parent / "include"

# Only the libraries a CPU program needs: libtorch_cpu (ATen's operators) and libc10; libtorch.so is a
# thin shim that also pulls in the CUDA libraries of a CUDA wheel (loading them costs ~0.3 s)
CPU_LIBS = ("torch_cpu", "c10")


def torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise KernelBuildError("kiln.runtime.cxx: torch is not installed in this environment; the C++ runner "
                               "builds against the torch wheel's headers and libraries")
    return Path(spec.origin).parent


def cflags() -> list[str]:
    t = torch_dir()
    return ["-std=c++20", f"-I{INCLUDE_DIR}", f"-I{t / 'include'}",
            f"-I{t / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]


def ldflags() -> list[str]:
    lib = torch_dir() / "lib"
    return [f"-L{lib}", f"-Wl,-rpath,{lib}", *(f"-l{name}" for name in CPU_LIBS), "-ldl"]
