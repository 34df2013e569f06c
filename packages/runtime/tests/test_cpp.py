"""C++ kernels: build with g++, load via ctypes from bytes or a path, rebuild when a binary does not fit."""

from __future__ import annotations

import ctypes
import logging
import shutil

import pytest
import torch
from runtime_testlib import CPP, CPP_SOURCE, cpp_program, reseal

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import (
    CompileCache,
    KernelBuildError,
    compile_cpp,
    load_compiled_function,
    load_cpp_library,
    save_artifact,
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def so_bytes() -> bytes:
    return compile_cpp(CPP_SOURCE)  # the session's default cache: built once for all tests here


def _add(lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    fn = lib.add_scaled
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_float]
    out = torch.empty_like(a)
    fn(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel(), 2.0)
    return out


def test_compile_and_load_from_bytes_and_path(so_bytes, tmp_path):
    assert so_bytes[:4] == b"\x7fELF"
    a, b = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(_add(load_cpp_library(so_bytes), a, b), a + 2 * b)
    path = tmp_path / "k.so"
    path.write_bytes(so_bytes)
    torch.testing.assert_close(_add(load_cpp_library(path), a, b), a + 2 * b)


def test_compile_is_cached_by_source(so_bytes, tmp_path):
    cache = CompileCache(tmp_path / "c")
    first = compile_cpp(CPP_SOURCE, cache=cache)
    assert cache.info().namespaces["cpp_so"][0] == 1
    assert compile_cpp(CPP_SOURCE, cache=cache) == first  # a hit: no second g++ run
    assert cache.info().namespaces["cpp_so"][0] == 1


def test_bad_binary_is_rebuilt_from_source(so_bytes, caplog):
    a, b = torch.randn(10), torch.randn(10)
    with caplog.at_level(logging.WARNING, logger="kiln.runtime"):
        lib = load_cpp_library(b"\x7fELF not really a library", source=CPP_SOURCE, name="add")
    assert "rebuilding it from source" in caplog.text
    torch.testing.assert_close(_add(lib, a, b), a + 2 * b)
    with pytest.raises(KernelBuildError, match="no source to rebuild it from"):
        load_cpp_library(b"garbage", name="add")


def test_compile_error_is_reported():
    with pytest.raises(KernelBuildError, match="C\\+\\+ compilation failed"):
        compile_cpp("this is not C++;")


def _save_cpp_artifact(path, so: bytes):
    a, b = torch.randn(64), torch.randn(64)
    program = PortableProgram(CPP, files={"kernels/add.so": so, "kernels/add.cpp": CPP_SOURCE.encode()})
    save_artifact(path, program, input_names=["a", "b"], format="dir",
                  input_specs=[TensorSpec.from_tensor(a), TensorSpec.from_tensor(b)], backend="test")
    return a, b


def test_artifact_with_a_shared_library(so_bytes, tmp_path):
    a, b = _save_cpp_artifact(tmp_path / "d", so_bytes)
    fn = load_compiled_function(tmp_path / "d")
    assert "kernels/add.so" in fn.module.FILES
    torch.testing.assert_close(fn(a, b)[0], a + 2 * b)
    assert "cpp_binary" in fn.as_text() and "cpp_source" in fn.as_text()


def test_binary_for_another_cpu_is_rebuilt(so_bytes, tmp_path):
    a, b = _save_cpp_artifact(tmp_path / "d", so_bytes)
    reseal(tmp_path / "d", lambda d: d["host"]["cpu_flags"].append("avx9000_imaginary"))
    fn = load_compiled_function(tmp_path / "d")
    assert "kernels/add.so" not in fn.module.FILES  # left out: rebuilt from kernels/add.cpp
    torch.testing.assert_close(fn(a, b)[0], a + 2 * b)
    reseal(tmp_path / "d", lambda d: d["host"].update(machine="riscv128"))
    torch.testing.assert_close(load_compiled_function(tmp_path / "d")(a, b)[0], a + 2 * b)


# ---- libraries loaded from the program's FILES (load_library_from) --------------------------------

FROM_FILES = cpp_program('''
from kiln.runtime.program_helpers import load_library_from as _load_library_from
_lib = _load_library_from(FILES, FILES_DIR, "add.so", ["g++", "-O2", "-shared", "-fPIC", "-fopenmp"], [])
''')


def test_load_library_from_memory_keeps_libraries_apart(so_bytes):
    """Two libraries loaded from memory one after the other are two libraries (dlopen knows a
    library by its path: a memfd path must not be reused while the first is loaded)."""
    from kiln.runtime.program_helpers import load_library_from

    other = compile_cpp(CPP_SOURCE.replace("a[i] + s * b[i]", "a[i] - s * b[i]"))
    a, b = torch.randn(16), torch.randn(16)
    first = load_library_from({"add.so": so_bytes}, None, "add.so", [], [])
    second = load_library_from({"add.so": other}, None, "add.so", [], [])
    torch.testing.assert_close(_add(first, a, b), a + 2 * b)
    torch.testing.assert_close(_add(second, a, b), a - 2 * b)


def test_load_library_from_rebuilds_from_the_source_in_files():
    from kiln.runtime.program_helpers import load_library_from

    lib = load_library_from({"add.cpp": CPP_SOURCE.encode()}, None, "add.so",
                            ["g++", "-O2", "-shared", "-fPIC"], [])
    a, b = torch.randn(16), torch.randn(16)
    torch.testing.assert_close(_add(lib, a, b), a + 2 * b)


def test_a_program_loading_its_library_from_files_writes_no_folder(so_bytes, tmp_path):
    """A new machine's load of a program whose files are a library (and its source) loaded with
    load_library_from creates no folder of files in the cache; an older program still gets one."""
    a, b = torch.randn(64), torch.randn(64)
    files = {"add.so": so_bytes, "add.cpp": CPP_SOURCE.encode()}
    specs = [TensorSpec.from_tensor(a), TensorSpec.from_tensor(b)]
    save_artifact(tmp_path / "new.kiln", PortableProgram(FROM_FILES, files=files), input_names=["a", "b"],
                  input_specs=specs)
    cache = CompileCache(tmp_path / "cache")
    fn = load_compiled_function(tmp_path / "new.kiln", cache=cache)
    torch.testing.assert_close(fn(a, b)[0], a + 2 * b)
    assert fn.module.FILES_DIR == ""
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("add.so"))
    old = FROM_FILES.replace("load_library_from as _load_library_from", "load_library as _load_library")
    old = old.replace("_load_library_from(FILES, FILES_DIR,", "_load_library(FILES_DIR,")
    save_artifact(tmp_path / "old.kiln", PortableProgram(old, files=files), input_names=["a", "b"],
                  input_specs=specs)
    fn = load_compiled_function(tmp_path / "old.kiln", cache=cache)
    torch.testing.assert_close(fn(a, b)[0], a + 2 * b)
    assert fn.module.FILES_DIR and list((tmp_path / "cache").rglob("add.so"))
