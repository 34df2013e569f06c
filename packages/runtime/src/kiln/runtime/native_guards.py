"""Build and load kiln's native guard checker (``native_guards.cpp``) and hand it to kiln.graph.

The extension includes Python.h and c10's TensorImpl.h only (~1.3 s of g++ on a 2-core host), links
libc10, and is built once per (source, Python, torch release, compiler, host) into the compile cache
(namespace ``cpp_so``, as C++ kernels are). ``install()`` builds or loads it once per process, checks it
against kiln.graph's Python checks on a table of cases (``guards_native.self_test``), and installs it;
guard sets compiled after that check in native code. Any failure (no compiler, a build error, a
disagreement) is logged once and leaves every check in Python, which gives the same answers.
KILN_NATIVE_GUARDS=0 turns it off.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import torch

from kiln.graph import guards_native

from .cache import default_cache
from .cpp import compile_cpp
from .cxx.flags import torch_dir
from .errors import KernelBuildError
from .knobs import KNOBS

logger = logging.getLogger("kiln.runtime")

SOURCE = Path(__file__).with_name("native_guards.cpp")
MODULE_NAME = "kiln_native_guards"


class _State:
    done = False
    module: ModuleType | None = None
    reason = ""  # why the checks stay in Python


_STATE = _State()


def _flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    lib = torch_dir() / "lib"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    flags = ("-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
             f"-I{sysconfig.get_paths()['include']}", f"-I{torch_dir() / 'include'}",
             # part of the cache key: a torch upgrade in place changes TensorImpl behind the same paths
             f"-DKILN_TORCH_VERSION=\"{torch.__version__}\"", f"-DKILN_PYTHON={sys.hexversion}")
    return flags, (f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}")


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    if spec is None:
        raise ImportError(f"kiln native guards: no module spec for {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load() -> ModuleType:
    """The built extension (from the compile cache when it is there). Raises KernelBuildError, OSError
    or ImportError."""
    flags, link = _flags()
    binary = compile_cpp(SOURCE.read_text(), flags=flags, link_flags=link, pch=False)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return default_cache().with_file("cpp_lib", binary, suffix, _import)


def install() -> bool:
    """Build or load the native checker once per process and install it in kiln.graph; False (the
    reason logged once, and in ``reason()``) when the checks stay in Python."""
    if _STATE.done:
        return _STATE.module is not None
    _STATE.done = True
    if not KNOBS.native_guards:
        _STATE.reason = "KILN_NATIVE_GUARDS=0"
        return False
    try:
        module = load()
    except (KernelBuildError, OSError, ImportError) as e:
        _STATE.reason = f"the native guard checker did not build or load: {e}"
        logger.warning("kiln: guards are checked in Python (slower per call, same answers): %s", _STATE.reason)
        return False
    wrong = guards_native.self_test(module)
    if wrong is not None:
        _STATE.reason = f"the native guard checker disagreed with the Python checks: {wrong}"
        logger.warning("kiln: guards are checked in Python: %s", _STATE.reason)
        return False
    guards_native.install(module)
    _STATE.module = module
    return True


def reason() -> str:
    """Why guards are checked in Python ('' when the native checker is installed or not yet asked for)."""
    return _STATE.reason
