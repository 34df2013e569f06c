"""Deployment without Python: the package format (package.py), the build of its model.so (build.py), the
C++ runner's headers (``include/kiln/runner.h``) and their build flags (flags.py,
``python -m kiln.runtime.cxx [--cuda] --cflags --ldflags``), and a Python loader of the same package (loader.py).
"""

from .build import BuildReport, build_model_library
from .flags import INCLUDE_DIR, cflags, cuda_include_dirs, ldflags, torch_dir
from .graph_library import FLOAT_ARGUMENT, GraphLibrary, build_graph_library
from .loader import PackagedModel, load_package
from .package import (
    KERNELS,
    LIBRARY,
    MANIFEST,
    SCHEMA_VERSION,
    WEIGHTS,
    PackageError,
    built_for,
    dtype_name,
    read_manifest,
    tensor_spec,
    write_cubins,
    write_manifest,
    write_safetensors,
)

__all__ = [
    "FLOAT_ARGUMENT", "INCLUDE_DIR", "KERNELS", "GraphLibrary", "build_graph_library", "LIBRARY", "MANIFEST", "SCHEMA_VERSION", "WEIGHTS", "BuildReport", "PackageError",
    "PackagedModel", "build_model_library", "built_for", "cflags", "cuda_include_dirs", "dtype_name", "ldflags", "load_package", "read_manifest",
    "tensor_spec", "torch_dir", "write_cubins", "write_manifest", "write_safetensors",
]
