"""Triton kernels from source text: generated wrappers carry their kernels as plain source.

``triton.jit`` reads a kernel's source through ``inspect``, so the text is written to a
content-addressed ``.py`` file in the compile cache and imported from there; Triton compiles each
kernel for the GPU it finds on the first launch (and keeps its own binary cache).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from types import ModuleType

from . import triton_preload
from .cache import CompileCache, default_cache
from .errors import KernelBuildError
from .triton_binaries import MODULE_PREFIX


def triton_module_name(source: str) -> str:
    """The module name ``load_triton_module`` imports ``source`` as (what ``PortableProgram.triton_modules``
    lists): ``kiln_triton_<sha256[:32]>`` of the text."""
    return MODULE_PREFIX + hashlib.sha256(source.encode()).hexdigest()[:32]


def load_triton_module(source: str, *, cache: CompileCache | None = None) -> ModuleType:
    """Import Triton kernel source text as the module ``kiln_triton_<sha256[:32]>`` (once per distinct
    text per process). The one loader: generated wrappers call it (kiln.inductor's codegen imports it
    as ``_kiln_load_triton_module``), and so do in-process compiles, the autotuner and the compile
    pool's producers. A module newly imported is handed to ``triton_preload.adopt_module``: the
    binaries an artifact or cache entry loaded in this process carries for it are filed into triton's
    kernel cache (no compile, no cache lookup at first launch)."""
    name = triton_module_name(source)
    found = sys.modules.get(name)
    if found is not None:
        return found
    if importlib.util.find_spec("triton") is None:
        raise KernelBuildError("these kernels need triton, which is not installed: pip install triton")
    path = (cache or default_cache()).materialize("triton_src", source.encode(), ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelBuildError(f"cannot import Triton kernels from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton resolves a kernel's globals through its module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise KernelBuildError(f"Triton kernel source failed to import ({type(e).__name__}: {e}); "
                               f"the source is at {path}") from e
    triton_preload.adopt_module(module)
    return module


def load_triton_kernel(source: str, kernel_name: str, *, cache: CompileCache | None = None) -> object:
    """The ``@triton.jit`` function ``kernel_name`` defined in ``source``."""
    module = load_triton_module(source, cache=cache)
    try:
        return getattr(module, kernel_name)
    except AttributeError:
        raise KernelBuildError(f"Triton source defines no kernel named {kernel_name!r}") from None
