"""The C++/OpenMP backend: every kernel of a graph in one translation unit, one shared library."""

from __future__ import annotations

from ...ir import (
    Kernel,
    KernelGroup,
    Layout,
    ScheduledProgram,
    checks_indices,
    is_float_symbol,
    kernel_size_symbols,
)
from ...options import InductorOptions
from ..common import CompiledKernels
from .build import CppCompileError, build_shared_library
from .dedup import canonical_source, kernel_key
from .group import RangeFunctions, group_source
from .kernel import kernel_params, kernel_source
from .prelude import PRELUDE, VECTOR_MATH

# The wrapper loads its library from its bytes in FILES (a memfd: a loaded artifact needs no folder of
# files) or from FILES_DIR; if that fails (another machine or libc), it rebuilds from the shipped
# .cpp with the same flags into a temporary folder (kiln.runtime.program_helpers: constant code
# imported, not compiled with every artifact). kiln.runtime writes no FILES_DIR for a program whose
# only files are libraries loaded this way.
LOADER = """
from kiln.runtime.program_helpers import bind_kernels as _bind_kernels
from kiln.runtime.program_helpers import load_library_from as _load_library_from
_lib = _load_library_from(FILES, FILES_DIR, {name!r}, {flags!r}, {link!r})"""


INDEX_CHECKS = """from kiln.runtime.program_helpers import index_error as _index_error
from kiln.runtime.program_helpers import index_errors as _index_errors
_ierr = _index_errors(_lib)"""


class CppBackend:
    name = "cpp"

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions) -> CompiledKernels:
        kernels = scheduled.launched()
        if not kernels:
            return CompiledKernels({}, "", {}, "", "")
        source, symbol = library_source(kernels, layouts, options)
        data, so, seconds = build_shared_library(source, options)
        lib_name = so.name
        flags = [options.cxx, *options.cpp_flags]
        prelude = [LOADER.format(name=lib_name, flags=flags, link=list(options.link_flags))]
        launches: dict[str, str] = {}
        # one string table instead of three statements per kernel: the wrapper's compile() at load
        # time grows with its statements, and a string constant costs next to nothing to compile
        table = []
        sized = []  # kernels with symbolic sizes: their int64 sizes (double floats) follow the pointers
        checked = False
        for k in kernels:
            ins, outs = kernel_params(k)
            sizes = kernel_size_symbols(k)
            table.append(f"_{k.name} {symbol[k.name]} {len(ins) + len(outs)}")
            args = ", ".join([f"{b}.data_ptr()" for b in (*ins, *outs)] + sizes)
            launches[k.name] = f"_{k.name}({args})"
            if checks_indices(k):  # an index out of range raises after the kernel (prelude: kiln_check_index)
                checked = True
                launches[k.name] = (f"_b = _ierr[0]; _{k.name}({args}) or _ierr[0] == _b or "
                                    f"_index_error(_ierr, {k.name!r})")
            if sizes:
                types = ", ".join("ctypes.c_double" if is_float_symbol(s) else "ctypes.c_int64" for s in sizes)
                sized.append(f"_{k.name}.argtypes = [ctypes.c_void_p] * {len(ins) + len(outs)} + [{types}]")
        prelude.append('_bind_kernels(globals(), _lib, """\n' + "\n".join(table) + '\n""")')
        if checked:
            prelude.append(INDEX_CHECKS)
        prelude += sized
        files = {lib_name: data, lib_name.replace(".so", ".cpp"): source.encode()}
        return CompiledKernels(files, "\n".join(prelude), launches, source, str(so.parent), seconds)


def library_source(kernels: list[Kernel | KernelGroup], layouts: dict[str, Layout],
                   options: InductorOptions) -> tuple[str, dict[str, str]]:
    """The translation unit of a graph's launched kernels (and groups) and each one's exported symbol
    (shared by the Python wrapper's library and the C++ wrapper's model library, codegen/cpp_wrapper)."""
    bodies, symbol = unique_kernel_sources(kernels, layouts, options)
    head = VECTOR_MATH if options.vectorize_math else ""
    return head + PRELUDE + "\n\n" + "\n\n".join(bodies) + "\n", symbol


def unique_kernel_sources(kernels: list[Kernel | KernelGroup], layouts: dict[str, Layout],
                          options: InductorOptions) -> tuple[list[str], dict[str, str]]:
    """The C++ bodies to build, one per distinct kernel or group (``kernel_key``), and each one's
    exported symbol: the name of the first with its key. Only distinct kernels are generated and
    compiled (code generation and g++ time grow with the bodies). Groups' range functions come first."""
    bodies: list[str] = []
    seen: dict[str, str] = {}  # kernel key -> symbol
    symbol: dict[str, str] = {}
    functions = RangeFunctions(layouts, options)
    for k in kernels:
        key = kernel_key(k, layouts)
        if key not in seen:
            seen[key] = k.name
            if isinstance(k, KernelGroup):
                bodies.append(group_source(k, layouts, options, functions))
            else:
                bodies.append(kernel_source(k, layouts, options))
        symbol[k.name] = seen[key]
    return functions.sources + bodies, symbol


__all__ = ["CppBackend", "CppCompileError", "canonical_source", "kernel_key", "library_source",
           "unique_kernel_sources"]
