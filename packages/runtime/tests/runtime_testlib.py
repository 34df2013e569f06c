"""Hand-written PortablePrograms used by the tests (what a backend would generate)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.runtime.manifest import integrity_of

# triton reads TRITON_INTERPRET once, at import: a run that also collects inductor's Triton tests (whose
# conftest turns the interpreter on) has no compiled kernels to record or preload
needs_compiled_triton = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1",
    reason="the Triton interpreter is on in this process; run packages/runtime/tests alone")


def reseal(artifact_dir: Path, edit) -> None:
    """Edit a directory artifact's manifest (``edit(dict)``) and recompute its integrity hash."""
    path = artifact_dir / "manifest.json"
    d = json.loads(path.read_text())
    edit(d)
    d["integrity"] = integrity_of(d)
    path.write_text(json.dumps(d))

ATEN = '''
import torch
aten = torch.ops.aten

def call(args):
    x, w, b = args
    y = aten.addmm(b, x, aten.t(w))
    return (aten.relu(y), aten.sum(y))
'''

AUTOGRAD = '''
import torch
aten = torch.ops.aten

class LinearTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, x):
        y = aten.tanh(aten.mm(x, aten.t(w)))
        ctx.save_for_backward(w, x, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        w, x, y = ctx.saved_tensors
        gz = aten.mul(gy, aten.rsub(aten.mul(y, y), 1))
        return aten.mm(aten.t(gz), x), aten.mm(gz, w)

def call(args):
    return (LinearTanh.apply(*args),)
'''

CPP_SOURCE = r'''
extern "C" void add_scaled(const float* a, const float* b, float* out, long n, float s) {
  #pragma omp parallel for simd
  for (long i = 0; i < n; ++i) out[i] = a[i] + s * b[i];
}
'''

# a program calling add_scaled from a library ``_lib`` its first lines load (``cpp_program``)
_CPP_CALL = '''
_add = _lib.add_scaled
_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_float]
_add.restype = None

def call(args):
    a, b = args
    out = torch.empty_like(a)
    _add(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel(), 2.0)
    return (out,)
'''


def cpp_program(load: str) -> str:
    """The add_scaled program with ``load`` (source lines binding ``_lib``) as its loader."""
    return "\nimport ctypes\nimport torch\n" + load.strip("\n") + "\n" + _CPP_CALL


CPP = cpp_program('''
from kiln.runtime import load_cpp_library

_lib = load_cpp_library(FILES.get("kernels/add.so"), source=FILES["kernels/add.cpp"].decode(),
                        name="add")
''')

TRITON_KERNELS = '''
import triton
import triton.language as tl

@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + 2.0 * b, mask=mask)
'''

TRITON = '''
import torch
from kiln.runtime import load_triton_kernel

add_kernel = load_triton_kernel(FILES["kernels.py"].decode(), "add_kernel")

def call(args):
    a, b = args
    out = torch.empty_like(a)
    n = a.numel()
    add_kernel[((n + 127) // 128,)](a, b, out, n, BLOCK=128)
    return (out,)
'''

MATMUL = '''
import torch
aten = torch.ops.aten

def call(args):
    w, x = args
    return (aten.mm(x, w),)
'''


def apply_twice(fn, x):
    """A module-level function an FX graph may call (importable, so portable)."""
    return fn(fn(x)[0])[0]


class TargetOnlyDriver:
    """What triton's JIT asks of a driver to compile for ``target`` (backend, arch, warp size), and nothing
    that needs a GPU: kernels cross-compile on a CPU-only host."""

    def __init__(self, target: tuple[str, int, int] = ("cuda", 90, 32)) -> None:
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(*target)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def target_only_driver(monkeypatch, cache_dir: Path, target: tuple[str, int, int] = ("cuda", 90, 32)) -> Iterator[None]:
    """Triton compiles for ``target`` into ``cache_dir`` for the duration (its previous driver restored)."""
    from triton.runtime import driver
    previous = getattr(driver, "_active", None)
    driver.set_active(TargetOnlyDriver(target))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_dir))  # triton's knobs.cache.dir reads it on use
    try:
        yield
    finally:
        driver._active = previous
