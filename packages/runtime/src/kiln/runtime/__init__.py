"""kiln.runtime: ahead-of-time artifacts (save/load), the compile cache, and kernel launchers.

Imports only torch and kiln.graph, so a saved artifact loads and runs with kiln-runtime alone.

Artifacts: ``save_artifact`` / ``build_artifact`` turn a ``kiln.graph.PortableProgram`` plus its
inputs' sources, specs and guards into an ``Artifact`` (directory or zip); ``load_artifact`` reads
and verifies one; ``load_compiled_function`` makes it callable again (``LoadedFunction``).
Sources and bindings: see the Note in ``kiln/runtime/sources.py``.
Cache: ``CompileCache`` (``default_cache()`` at ``KILN_CACHE_DIR``); the graph-level cache
(``cached_backend`` wraps a backend: captured graph + inputs -> compiled program).
Launchers for generated code: ``compile_cpp``, ``load_cpp_library``, ``load_triton_module``.
FX graphs as portable source: ``program_from_graph_module``, ``graph_module_source``.
Generated programs import their constant helper code from ``kiln.runtime.program_helpers``.
"""

from .artifact import Artifact, build_artifact, load_artifact, save_artifact
from .bindings import Binding
from .cache import CacheInfo, CompileCache, cache_key, default_cache
from .cli import artifact_text, cache_clear, cache_info, cache_info_text
from .code_cache import flush_code_writes
from .cpp import CXX_FLAGS, PCH_END, compile_cpp, cpp_cache_key, load_cpp_library
from .environment import DeviceInfo, HostInfo
from .errors import ArtifactError, GuardError, KernelBuildError
from .graph_cache import CachedGraph, GraphCache, Uncacheable, cached_backend, graph_key
from .loaded import LoadedFunction, load_compiled_function
from .manifest import FILE_KINDS, SCHEMA_VERSION, InputRecord, Manifest
from .portable import graph_module_source, program_from_graph_module

# the constant code saved programs import (inductor wrappers, autograd programs): imported with the
# runtime, as a part of it, not at an artifact's load
from . import program_helpers  # noqa: E402,F401  isort: skip
from .sources import CallFrame, Param
from .triton_binaries import collect_triton_binaries, install_triton_binaries
from .triton_kernels import load_triton_kernel, load_triton_module, triton_module_name

__all__ = [
    "CXX_FLAGS", "FILE_KINDS", "SCHEMA_VERSION", "Artifact", "ArtifactError", "Binding", "CacheInfo",
    "CachedGraph", "CallFrame", "CompileCache", "GraphCache", "Uncacheable", "cached_backend", "graph_key", "DeviceInfo", "GuardError", "HostInfo", "InputRecord",
    "KernelBuildError", "LoadedFunction", "Manifest", "Param", "artifact_text", "build_artifact",
    "PCH_END", "cache_clear", "cache_info", "flush_code_writes", "collect_triton_binaries", "install_triton_binaries", "cache_key", "cache_info_text", "compile_cpp", "cpp_cache_key", "default_cache", "graph_module_source", "load_artifact",
    "load_compiled_function", "load_cpp_library", "load_triton_kernel", "load_triton_module", "triton_module_name",
    "program_from_graph_module", "save_artifact",
]
