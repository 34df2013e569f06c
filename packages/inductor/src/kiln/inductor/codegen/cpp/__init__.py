"""The C++/OpenMP backend: every kernel of a graph in one translation unit, one shared library."""

from __future__ import annotations

from ...ir import Layout, ScheduledProgram
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
        bodies = [kernel_source(k, layouts, options) for k in kernels]
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
            prelude.append(f"_{k.name} = _lib.{k.name}")
            prelude.append(f"_{k.name}.argtypes = [ctypes.c_void_p] * {n_args}")
            prelude.append(f"_{k.name}.restype = None")
            args = ", ".join(f"{b}.data_ptr()" for b in (*ins, *outs))
            launches[k.name] = f"_{k.name}({args})"
        files = {lib_name: so.read_bytes(), lib_name.replace(".so", ".cpp"): source.encode()}
        return CompiledKernels(files, "\n".join(prelude), launches, source, str(so.parent), seconds)


__all__ = ["CppBackend", "CppCompileError"]
