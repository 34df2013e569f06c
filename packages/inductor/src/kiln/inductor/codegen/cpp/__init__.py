"""The C++/OpenMP backend: every kernel of a graph in one translation unit, one shared library."""

from __future__ import annotations

import re

from ...ir import Kernel, Layout, ScheduledProgram
from ...options import InductorOptions
from ..common import CompiledKernels
from .build import CppCompileError, build_shared_library
from .kernel import kernel_params, kernel_source
from .prelude import PRELUDE, VECTOR_MATH

# The wrapper loads its library from FILES_DIR; if that fails (another machine or libc), it rebuilds
# from the shipped .cpp with the same flags into a temporary folder.
LOADER = '''
def _load_library(name):
    path = os.path.join(FILES_DIR, name)
    try:
        return ctypes.CDLL(path)
    except OSError as first:
        import subprocess, tempfile
        out = os.path.join(tempfile.mkdtemp(prefix="kiln-rebuild-"), name)
        cmd = {flags!r} + [path[:-3] + ".cpp", "-o", out] + {link!r}
        try:
            subprocess.run(cmd, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"cannot load {{path}} ({{first}}) nor rebuild it from its C++ source ({{e}})") from e
        return ctypes.CDLL(out)
'''


class CppBackend:
    name = "cpp"

    def compile(self, scheduled: ScheduledProgram, layouts: dict[str, Layout],
                options: InductorOptions) -> CompiledKernels:
        kernels = scheduled.kernels()
        if not kernels:
            return CompiledKernels({}, "", {}, "", "")
        bodies, symbol = unique_kernel_sources(kernels, layouts, options)
        head = VECTOR_MATH if options.vectorize_math else ""
        source = head + PRELUDE + "\n\n" + "\n\n".join(bodies) + "\n"
        so, seconds = build_shared_library(source, options)
        lib_name = so.name
        flags = [options.cxx, *options.cpp_flags]
        prelude = [LOADER.format(flags=flags, link=list(options.link_flags)),
                   f"_lib = _load_library({lib_name!r})"]
        launches: dict[str, str] = {}
        for k in kernels:
            ins, outs = kernel_params(k)
            n_args = len(ins) + len(outs)
            prelude.append(f"_{k.name} = _lib.{symbol[k.name]}")
            prelude.append(f"_{k.name}.argtypes = [ctypes.c_void_p] * {n_args}")
            prelude.append(f"_{k.name}.restype = None")
            args = ", ".join(f"{b}.data_ptr()" for b in (*ins, *outs))
            launches[k.name] = f"_{k.name}({args})"
        files = {lib_name: so.read_bytes(), lib_name.replace(".so", ".cpp"): source.encode()}
        return CompiledKernels(files, "\n".join(prelude), launches, source, str(so.parent), seconds)


def canonical_source(k: Kernel, source: str) -> str:
    """``source`` with the kernel's name and every buffer name in it (pointer parameters ``p_buf3``,
    locals ``v_buf3``, ``acc_buf3_1``) renamed in order of first appearance: two kernels with equal
    canonical sources compute the same function of their arguments, in the same order (a
    transformer's layers give the same kernels over other buffers), so one compiled body serves both."""
    names = {k.name, *k.inputs, *k.outputs, *(kn.buffer for kn in k.nodes)}
    # a name is delimited by anything but a letter or digit: "_" joins it to its prefix/suffix
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(
        re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?![A-Za-z0-9])")
    renamed: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        return renamed.setdefault(m.group(1), f"N{len(renamed)}")
    return pattern.sub(rename, source)


def unique_kernel_sources(kernels: list[Kernel], layouts: dict[str, Layout],
                          options: InductorOptions) -> tuple[list[str], dict[str, str]]:
    """The C++ bodies to build, one per distinct kernel, and each kernel's exported symbol: the
    name of the first kernel with the same canonical source (g++ time grows with the bodies)."""
    bodies: list[str] = []
    seen: dict[str, str] = {}  # canonical source -> symbol
    symbol: dict[str, str] = {}
    for k in kernels:
        source = kernel_source(k, layouts, options)
        key = canonical_source(k, source)
        if key not in seen:
            seen[key] = k.name
            bodies.append(source)
        symbol[k.name] = seen[key]
    return bodies, symbol


__all__ = ["CppBackend", "CppCompileError", "canonical_source", "unique_kernel_sources"]
