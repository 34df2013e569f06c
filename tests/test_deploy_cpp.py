"""End to end on CPU: export two small models, package them, run them from C++ (examples/deploy_cpp/main.cpp
built with ``python -m kiln.runtime.cxx --cflags --ldflags``) and from Python (kiln.load_package), compared
with eager; no libpython in the C++ process; bad inputs and corrupt, truncated or foreign packages refused
with clear messages by both runners."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kiln
import kiln.runtime.cxx as cxx
from kiln.runtime import GuardError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from models import example  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build packages")]
MODELS = ("transformer", "resnet18")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Both packages and the C++ program (built while the packages build: one g++ each, in parallel)."""
    d = tmp_path_factory.mktemp("deploy")
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", "--cflags", "--ldflags"],
                           capture_output=True, text=True, check=True).stdout.split()
    main = subprocess.Popen(["g++", "-O1", str(EXAMPLE / "main.cpp"), *flags, "-o", str(d / "main")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    models = {}
    for name in MODELS:
        model, inputs = example(name, small=True)
        kiln.package(kiln.export(model, inputs), d / name)
        with torch.no_grad():
            expected = model(*inputs)
        save_file({"input0": inputs[0]}, str(d / f"{name}.in.safetensors"))
        save_file({"output0": expected}, str(d / f"{name}.out.safetensors"))
        models[name] = model
    out, _ = main.communicate()
    assert main.returncode == 0, out
    return {"dir": d, "main": d / "main", "models": models}


def run_main(work: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(work["main"]), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", MODELS)
def test_cpp_runner_matches_eager_without_python(work: dict, name: str) -> None:
    d = work["dir"]
    r = run_main(work, str(d / name), str(d / f"{name}.in.safetensors"), str(d / f"{name}.out.safetensors"), "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"output0 shape \[.*\] max_abs_err .* ok", r.stdout), r.stdout
    assert "libpython mapped: no" in r.stdout
    ldd = subprocess.run(["ldd", str(work["main"])], capture_output=True, text=True).stdout
    assert "libpython" not in ldd and "libtorch_cpu" in ldd


@pytest.mark.parametrize("name", MODELS)
def test_python_loader_matches_eager(work: dict, name: str) -> None:
    loaded = kiln.load_package(work["dir"] / name)
    model = work["models"][name]
    _, inputs = example(name, small=True)
    for k in range(3):  # fresh inputs each call
        torch.manual_seed(100 + k)
        x = torch.randint(0, 256, inputs[0].shape) if name == "transformer" else torch.randn(inputs[0].shape)
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-5)


def test_cpp_bad_inputs(work: dict) -> None:
    r = run_main(work, str(work["dir"] / "resnet18"), "--bad-inputs")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "count: kiln::Runner::run: expected 1 inputs (x), got 0" in out
    assert "shape: kiln::Runner::run: input 0 ('x'): expected shape [1, 3, 64, 64], got [1, 3, 64, 64, 1]" in out
    assert "dtype: kiln::Runner::run: input 0 ('x'): expected dtype Float, got Double" in out
    assert "device: kiln::Runner::run: input 0 ('x') is on meta, the package runs on cpu" in out
    assert "good: ok" in out


def test_python_bad_inputs(work: dict) -> None:
    loaded = kiln.load_package(work["dir"] / "resnet18")
    with pytest.raises(GuardError, match=r"input 0 \('x'\): expected shape \[1, 3, 64, 64\], got \[2, 3, 64, 64\]"):
        loaded(torch.randn(2, 3, 64, 64))
    with pytest.raises(GuardError, match=r"input 0 \('x'\): expected dtype torch.float32, got torch.float64"):
        loaded(torch.randn(1, 3, 64, 64, dtype=torch.float64))
    with pytest.raises(GuardError, match=r"expected 1 inputs \(x\), got 2"):
        loaded(torch.randn(1, 3, 64, 64), torch.randn(1))
    # a non-contiguous input of the right shape is copied into the declared layout
    x = torch.randn(1, 64, 64, 3).permute(0, 3, 1, 2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), work["models"]["resnet18"](x), rtol=1e-5, atol=1e-5)


def _damaged(work: dict, how: str) -> Path:
    src = work["dir"] / "transformer"
    dst = work["dir"] / f"transformer-{how}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if how == "truncated-weights":
        w = dst / cxx.WEIGHTS
        w.write_bytes(w.read_bytes()[:-100])
    elif how == "corrupt-library":
        so = bytearray((dst / cxx.LIBRARY).read_bytes())
        so[len(so) // 2] ^= 0xFF
        (dst / cxx.LIBRARY).write_bytes(bytes(so))
    elif how == "future-schema":
        m = json.loads((dst / cxx.MANIFEST).read_text())
        m["schema_version"] = 99
        (dst / cxx.MANIFEST).write_text(json.dumps(m))
    elif how == "foreign":
        (dst / cxx.MANIFEST).write_text(json.dumps({"name": "some other format"}))
    elif how == "garbled-manifest":
        (dst / cxx.MANIFEST).write_text('{"format": "kiln-package", "schema_version": ')
    elif how == "other-cpu":
        m = json.loads((dst / cxx.MANIFEST).read_text())
        m["built_for"]["cpu_flags"].append("kiln_future_isa")
        (dst / cxx.MANIFEST).write_text(json.dumps(m))
    elif how == "other-torch":
        m = json.loads((dst / cxx.MANIFEST).read_text())
        m["built_for"]["torch"] = "1.0.0"
        (dst / cxx.MANIFEST).write_text(json.dumps(m))
    return dst


DAMAGE = {
    "truncated-weights": r"weights.safetensors has \d+ bytes, the manifest says \d+ \(truncated or replaced\)",
    "corrupt-library": r"model.so does not match its sha256 in the manifest",
    "future-schema": r"manifest schema version 99",
    "foreign": r"not a kiln package manifest",
    "garbled-manifest": r"manifest.json",
    "other-torch": r"built for torch 1.0.0",
    "other-cpu": r"built on a CPU with instructions this one lacks \(kiln_future_isa\)",
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_package_refused(work: dict, how: str) -> None:
    pkg = _damaged(work, how)
    d = work["dir"]
    r = run_main(work, str(pkg), str(d / "transformer.in.safetensors"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"kiln::Runner: package {pkg}" in r.stderr and re.search(DAMAGE[how], r.stderr), r.stderr
    with pytest.raises(cxx.PackageError, match=DAMAGE[how] if how != "garbled-manifest" else "unreadable"):
        kiln.load_package(pkg)
