"""kiln.runtime.cxx without a C++ build: the printed flags, the weights file (read back by the safetensors
library), and the manifest checks shared with kiln/runner.h (format, schema, torch, sizes, hashes)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import kiln.runtime.cxx as cxx
from kiln.runtime.errors import KernelBuildError


def test_flags_point_at_torch_and_the_runner_header() -> None:
    out = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", "--cflags", "--ldflags"],
                         capture_output=True, text=True, check=True).stdout.split()
    includes = [Path(f[2:]) for f in out if f.startswith("-I")]
    assert any((d / "kiln" / "runner.h").exists() for d in includes)
    assert any((d / "ATen" / "core" / "Tensor.h").exists() for d in includes)
    libdirs = [Path(f[2:]) for f in out if f.startswith("-L")]
    assert any((d / "libtorch_cpu.so").exists() for d in libdirs)
    assert "-ltorch_cpu" in out and "-lc10" in out and "-std=c++20" in out
    assert not any("python" in f for f in out if f.startswith("-l"))


def test_weights_are_plain_safetensors(tmp_path: Path) -> None:
    tensors = {"a.weight": torch.randn(3, 4), "ids": torch.arange(5), "mask": torch.tensor([True, False]),
               "half": torch.randn(7).half(), "t": torch.randn(4, 3).t()}
    cxx.write_safetensors(tmp_path / "w.safetensors", tensors, {"format": "pt"})
    back = load_file(str(tmp_path / "w.safetensors"))
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert torch.equal(back[k], t)
    header_len = int.from_bytes((tmp_path / "w.safetensors").read_bytes()[:8], "little")
    assert (8 + header_len) % 64 == 0  # data starts aligned


def test_cuda_flags_name_cuda_headers_and_libraries() -> None:
    try:
        dirs = cxx.cuda_include_dirs()
    except KernelBuildError as e:
        pytest.skip(f"no CUDA headers in this environment: {e}")
    if not (cxx.torch_dir() / "lib" / "libtorch_cuda.so").exists():
        pytest.skip("a CPU build of torch: no libtorch_cuda")
    out = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", "--cuda", "--cflags", "--ldflags"],
                         capture_output=True, text=True, check=True).stdout.split()
    includes = [Path(f[2:]) for f in out if f.startswith("-I")]
    for header in ("cuda_runtime_api.h", "crt/host_defines.h", "cuda.h"):  # what c10/cuda and the driver API include
        assert any((d / header).exists() for d in includes), header
    assert set(dirs) <= set(includes)
    # libtorch_cuda is linked even when the program calls nothing of it: loading it registers ATen's CUDA kernels
    k = out.index("-ltorch_cuda")
    assert out[k - 1] == "-Wl,--no-as-needed" and out[k + 1] == "-lc10_cuda" and out[k + 2] == "-Wl,--as-needed"
    assert "-lcuda" not in out  # the driver is opened at run time: programs link without one


def test_cubins_are_files_the_manifest_hashes(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    names = cxx.write_cubins(pkg, {"k0.abc.cubin": b"\x7fELF cubin"})
    assert names == ["kernels/k0.abc.cubin"]
    cxx.write_manifest(pkg, {"device": "cuda", "built_for": cxx.built_for("cuda", [], {"cuda_arch": 90}),
                             "inputs": [], "outputs": [], "constants": []}, extra_files=names)
    m = cxx.read_manifest(pkg)
    assert m["files"]["kernels/k0.abc.cubin"]["sha256"] == hashlib.sha256(b"\x7fELF cubin").hexdigest()
    assert m["built_for"]["cuda_arch"] == 90 and "cpu_flags" not in m["built_for"]
    (pkg / "kernels" / "k0.abc.cubin").write_bytes(b"\x7fELF cubiN")
    with pytest.raises(cxx.PackageError, match="kernels/k0.abc.cubin does not match its sha256"):
        cxx.read_manifest(pkg)
    assert cxx.write_cubins(pkg, {"k1.def.cubin": b"x"}) == ["kernels/k1.def.cubin"]
    assert [p.name for p in (pkg / "kernels").iterdir()] == ["k1.def.cubin"]  # a stale cubin is removed
    _edit(pkg, device="tpu")
    with pytest.raises(cxx.PackageError, match="built for device 'tpu'; this kiln runs packages on cpu or cuda"):
        cxx.read_manifest(pkg, verify=False)


def _package(tmp_path: Path) -> Path:
    (tmp_path / cxx.LIBRARY).write_bytes(b"\x7fELF not really a library")
    cxx.write_safetensors(tmp_path / cxx.WEIGHTS, {"w": torch.ones(2)}, {})
    cxx.write_manifest(tmp_path, {"device": "cpu", "built_for": cxx.built_for("cpu", ["-O3", "-march=native"]), "inputs": [],
                                  "outputs": [], "constants": []})
    return tmp_path


def _edit(folder: Path, **changes: object) -> None:
    m = json.loads((folder / cxx.MANIFEST).read_text())
    m.update(changes)
    (folder / cxx.MANIFEST).write_text(json.dumps(m))


def test_manifest_checks(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    m = cxx.read_manifest(pkg)
    assert m["schema_version"] == cxx.SCHEMA_VERSION and m["built_for"]["torch"] == torch.__version__
    assert set(m["files"]) == {cxx.LIBRARY, cxx.WEIGHTS}
    (pkg / cxx.WEIGHTS).write_bytes((pkg / cxx.WEIGHTS).read_bytes()[:-1])
    with pytest.raises(cxx.PackageError, match=r"weights.safetensors has 135 bytes, the manifest says 136 \(truncated"):
        cxx.read_manifest(pkg)
    pkg = _package(tmp_path)
    data = bytearray((pkg / cxx.LIBRARY).read_bytes())
    data[0] ^= 1
    (pkg / cxx.LIBRARY).write_bytes(bytes(data))
    with pytest.raises(cxx.PackageError, match="model.so does not match its sha256"):
        cxx.read_manifest(pkg)
    pkg = _package(tmp_path)
    _edit(pkg, schema_version=cxx.SCHEMA_VERSION + 1)
    with pytest.raises(cxx.PackageError, match=f"schema version {cxx.SCHEMA_VERSION + 1}"):
        cxx.read_manifest(pkg)
    _edit(pkg, format="something-else", schema_version=cxx.SCHEMA_VERSION)
    with pytest.raises(cxx.PackageError, match="not a kiln package manifest"):
        cxx.read_manifest(pkg)
    (pkg / cxx.MANIFEST).unlink()
    with pytest.raises(cxx.PackageError, match="no manifest.json"):
        cxx.read_manifest(pkg)


SHA_TEST = r"""
#include "kiln/detail/sha256.h"
#include <algorithm>
#include <cstdio>
#include <vector>
int main() {
  for (size_t n : {0, 1, 55, 56, 63, 64, 65, 127, 128, 1000, 100000}) {
    std::vector<uint8_t> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = uint8_t(i * 31 + 7);
    kiln::detail::Sha256 h;
    size_t i = 0, step = 7;  // odd pieces: the partial-block buffering too
    while (i < n) { size_t t = std::min(step, n - i); h.update(d.data() + i, t); i += t; step = step * 3 % 200 + 1; }
    std::printf("%zu %s\n", n, h.hex().c_str());
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("defines", [[], ["-DKILN_NO_SHA_NI"]], ids=["sha-extensions-if-any", "portable"])
def test_runner_sha256_matches_hashlib(tmp_path: Path, defines: list[str]) -> None:
    (tmp_path / "t.cpp").write_text(SHA_TEST)
    subprocess.run(["g++", "-O1", "-std=c++20", *defines, f"-I{cxx.INCLUDE_DIR}", str(tmp_path / "t.cpp"), "-o",
                    str(tmp_path / "t")], check=True)
    lines = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split("\n")
    for line in filter(None, lines):
        n, digest = line.split()
        assert hashlib.sha256(bytes((i * 31 + 7) % 256 for i in range(int(n)))).hexdigest() == digest, n
