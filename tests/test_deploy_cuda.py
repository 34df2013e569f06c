"""CUDA packages: kiln.package(..., device="cuda").

Without a GPU (CI): both example models, exported on CPU, are packaged for sm_90 -- Triton kernels
compiled into cubins, the C++ wrapper compiled and linked against libtorch_cuda, the C++ example built
with ``python -m kiln.runtime.cxx --cuda --cflags --ldflags`` -- and the manifest, the cubins and the
library are checked; both runners refuse what they cannot run, with clear messages (a CUDA package
without a GPU or on CPU, a CPU package on CUDA, a corrupt cubin). Skipped, saying why, when this torch
has no CUDA headers or libraries.

On a GPU (``-m gpu``): the models exported on the GPU (fp32 and bf16) run through kiln.load_package and
through the C++ program, against eager, with no libpython in the C++ process; bad inputs, and a package
built for another GPU architecture, are refused. A package exported with dynamic shapes (its cubins take
the sizes as int64 parameters) is built without a GPU and run on one at five sizes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kiln
import kiln.runtime.cxx as cxx
from kiln.deploy import ExportError
from kiln.inductor.codegen.triton.cubins import kernel_param_count
from kiln.runtime import GuardError, KernelBuildError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from export_models import export_one  # noqa: E402
from models import DYNAMIC_SIZES, example, padded_inputs  # noqa: E402

MODELS = ("transformer", "resnet18")


def _no_cuda_build() -> str:
    """Why CUDA packages cannot be built here ("" when they can)."""
    try:
        cxx.cuda_include_dirs()
        cxx.ldflags(cuda=True)
    except KernelBuildError as e:
        return f"CUDA packages cannot be built with this torch: {e}"
    return ""


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build packages"),
              pytest.mark.skipif(bool(_no_cuda_build()), reason=_no_cuda_build() or "-")]

# Packaging compiles cubins with triton's compiler: in a process without TRITON_INTERPRET (the test
# suite may run with it on)
PACKAGE = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {example!r})
    import kiln
    from models import example
    out = Path({out!r})
    for name in {names!r}:
        model, inputs = example(name, small=True)
        print(kiln.package(kiln.export(model, inputs), out / name, device="cuda", options={{"cuda_arch": 90}}).as_text())
""")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _build_main(out: Path) -> subprocess.Popen:
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", "--cuda", "--cflags", "--ldflags"],
                           capture_output=True, text=True, check=True).stdout.split()
    return subprocess.Popen(["g++", "-O1", str(EXAMPLE / "main.cpp"), *flags, "-o", str(out / "main")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Both models packaged for sm_90 from CPU exports, a CPU package, and the C++ example built for CUDA."""
    d = tmp_path_factory.mktemp("deploy_cuda")
    main = _build_main(d)
    script = PACKAGE.format(example=str(EXAMPLE), out=str(d), names=MODELS)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_clean_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    model, inputs = example("transformer", small=True)
    kiln.package(kiln.export(model, inputs), d / "transformer-cpu")
    save_file({"input0": inputs[0]}, str(d / "transformer.in.safetensors"))
    out, _ = main.communicate()
    assert main.returncode == 0, out
    return {"dir": d, "main": d / "main", "log": r.stdout}


def run_main(work: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(work["main"]), *args], capture_output=True, text=True, timeout=300)


def _cubin_sm(data: bytes) -> int:
    """The sm of a cubin (an ELF for EM_CUDA): e_flags' low byte up to CUDA 12's ptxas, its second from 13's."""
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190
    flags = int.from_bytes(data[48:52], "little")
    return flags & 0xFF if flags & 0xFF >= 20 else (flags >> 8) & 0xFF


@pytest.mark.parametrize("name", MODELS)
def test_package_holds_sm90_cubins_and_a_cuda_wrapper(work: dict, name: str) -> None:
    pkg = work["dir"] / name
    m = json.loads((pkg / cxx.MANIFEST).read_text())
    assert m["device"] == "cuda" and m["built_for"]["cuda_arch"] == 90 and m["built_for"]["triton"]
    assert all(s["device"] == "cuda" for s in m["inputs"] + m["outputs"])
    assert "cpu_flags" not in m["built_for"]  # no -march=native code in a CUDA package
    kernels = m["kernels"]
    assert kernels, "a model with pointwise work compiles Triton kernels"
    for k in kernels:
        data = (pkg / k["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == k["sha256"] == m["files"][k["file"]]["sha256"]
        assert _cubin_sm(data) == 90 and k["arch"] == 90 and k["num_warps"] in (1, 2, 4, 8, 16, 32)
    wrapper = (pkg / "src" / "wrapper.cpp").read_text()
    assert "#include <kiln/model_support_cuda.h>" in wrapper and not (pkg / "src" / "kernels.cpp").exists()
    launches = re.findall(r"^  launch\((\d+), (\d+), (\d+), (\d+), \{([^}]*)\}\);", wrapper, re.M)
    assert {int(i) for i, *_ in launches} == set(range(len(kernels))), "every cubin is launched, and only those"
    for i, gx, gy, gz, args in launches:  # the parameters each cubin takes are what the launch passes
        k = kernels[int(i)]
        passed = len(args.split(",")) + k["scratch_params"]
        assert kernel_param_count((pkg / k["file"]).read_bytes(), k["symbol"]) == passed, (k["symbol"], args)
        assert min(int(gx), int(gy), int(gz)) >= 1
    assert sorted(p.name for p in (pkg / cxx.KERNELS).iterdir()) == sorted(Path(k["file"]).name for k in kernels)


def test_model_library_links_libtorch_cuda_and_exports_the_abi(work: dict) -> None:
    so = work["dir"] / "resnet18" / cxx.LIBRARY
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    for sym in ("kiln_model_abi_version", "kiln_model_device", "kiln_model_init", "kiln_model_run",
                "kiln_model_release_outputs"):
        assert re.search(rf"\bT {sym}$", symbols, re.M), sym
    ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
    assert "libtorch_cuda" in ldd and "libc10_cuda" in ldd and "libpython" not in ldd
    assert "libcuda.so" not in ldd  # the driver is opened at run time


def test_model_library_refuses_the_wrong_device_type_and_a_missing_driver(work: dict) -> None:
    """model.so itself (its C ABI, through ctypes): it says what it was built for and refuses the rest."""
    pkg = work["dir"] / "transformer"
    lib = ctypes.CDLL(str(pkg / cxx.LIBRARY), mode=ctypes.RTLD_LOCAL)
    lib.kiln_model_device.restype = ctypes.c_char_p
    assert lib.kiln_model_abi_version() == 4 and lib.kiln_model_device() == b"cuda"
    init = lib.kiln_model_init
    init.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    err = ctypes.create_string_buffer(2048)
    assert init(str(pkg).encode(), 0, -1, err, len(err)) == 1
    assert err.value.decode() == "kiln model: this model.so was built for cuda, asked to run on another device type"
    if ctypes.util.find_library("cuda") is None:  # no driver here: the cubins cannot be loaded, and it says why
        assert init(str(pkg).encode(), 1, 0, err, len(err)) == 1
        assert "cannot load the CUDA driver (libcuda.so.1)" in err.value.decode()
        assert "a CUDA package needs an NVIDIA GPU and its driver" in err.value.decode()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_python_loader_refuses_cuda_package_without_gpu(work: dict) -> None:
    pkg = work["dir"] / "transformer"
    with pytest.raises(cxx.PackageError, match=r"built for cuda, and this process has no CUDA device"):
        kiln.load_package(pkg)
    with pytest.raises(cxx.PackageError, match=r"built for cuda, asked to run on cpu \(package it again with "
                                               r"kiln.package\(..., device='cpu'\)\)"):
        kiln.load_package(pkg, device="cpu")
    with pytest.raises(cxx.PackageError, match=r"built for cpu, asked to run on cuda"):
        kiln.load_package(work["dir"] / "transformer-cpu", device="cuda")


def test_cpp_runner_refuses_the_wrong_device(work: dict) -> None:
    d = work["dir"]
    inputs = str(d / "transformer.in.safetensors")
    r = run_main(work, str(d / "transformer"), inputs)
    assert r.returncode == 3 and "built for cuda, asked to run on cpu" in r.stderr, r.stderr
    r = run_main(work, "--cuda", str(d / "transformer-cpu"), inputs)
    assert r.returncode == 3 and "built for cpu, asked to run on cuda" in r.stderr, r.stderr
    if not torch.cuda.is_available():
        r = run_main(work, "--cuda", str(d / "transformer"), inputs)
        assert r.returncode == 3 and "built for cuda, and this machine has no CUDA device" in r.stderr, r.stderr
    # the CPU package still runs from the program built with the CUDA flags
    r = run_main(work, str(d / "transformer-cpu"), inputs)
    assert r.returncode == 0 and "libpython mapped: no" in r.stdout, r.stdout + r.stderr


def test_corrupt_cubin_refused(work: dict) -> None:
    src = work["dir"] / "transformer"
    dst = work["dir"] / "transformer-bad-cubin"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    cubin = sorted((dst / cxx.KERNELS).iterdir())[0]
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    want = rf"kernels/{re.escape(cubin.name)} does not match its sha256 in the manifest"
    with pytest.raises(cxx.PackageError, match=want):
        kiln.load_package(dst)
    r = run_main(work, "--cuda", str(dst), str(work["dir"] / "transformer.in.safetensors"))
    assert r.returncode == 3 and re.search(want, r.stderr), r.stderr


def test_package_options_refused_clearly(tmp_path: Path) -> None:
    e = kiln.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    with pytest.raises(ExportError, match="device 'mps' is not supported; packages run on 'cpu' or 'cuda'"):
        kiln.package(e, tmp_path / "p", device="mps")
    with pytest.raises(ExportError, match=r"options\['cuda_arch'\]='hopper'; expected a compute capability"):
        kiln.package(e, tmp_path / "p", device="cuda", options={"cuda_arch": "hopper"})
    with pytest.raises(ExportError, match=r"options\['cuda_arch'\] is for device='cuda'"):
        kiln.package(e, tmp_path / "p", options={"cuda_arch": 90})
    if not torch.cuda.is_available():
        with pytest.raises(ExportError, match=r"no GPU here to take the architecture from; name it: "
                                              r"options=\{'cuda_arch': 90\}"):
            kiln.package(e, tmp_path / "p", device="cuda")
        with pytest.raises(ExportError, match="no GPU here"):  # "cuda:0" is a CUDA package (the index is for loading)
            kiln.package(e, tmp_path / "p", device="cuda:0")


DYNAMIC_PACKAGE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {example!r})
    import kiln
    from models import DYNAMIC, example
    model, inputs = example("padded_transformer", small=True)
    exported = kiln.export(model, inputs, dynamic_shapes=DYNAMIC)
    print(kiln.package(exported, {out!r}, device="cuda", options={{"cuda_arch": 90}}).as_text())
""")


def test_dynamic_package_launches_cubins_with_size_arguments(tmp_path: Path) -> None:
    """Dynamic batch and sequence on CUDA: each cubin takes the size symbols as int64 parameters after
    its pointers (checked against the cubin's own parameter count), its grid is computed from them, and
    an empty launch is skipped."""
    pkg = tmp_path / "padded"
    script = DYNAMIC_PACKAGE.format(example=str(EXAMPLE), out=str(pkg))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_clean_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    m = json.loads((pkg / cxx.MANIFEST).read_text())
    assert m["device"] == "cuda" and len(m["sizes"]) == 4 and m["kernels"]
    symbols = {s["symbol"] for s in m["sizes"]}
    wrapper = (pkg / "src" / "wrapper.cpp").read_text()
    launches = re.findall(r"^  if \((.+) > 0\)  // (\w+)\n    launch\((\d+), unsigned\((.+)\), unsigned\((.+)\), 1, "
                          r"\{([^}]*)\}, \{([^}]*)\}\);$", wrapper, re.M)
    assert {int(i) for _, _, i, *_ in launches} == set(range(len(m["kernels"])))
    for _, _, i, _, _, args, sizes in launches:
        k = m["kernels"][int(i)]
        names = [s.strip() for s in sizes.split(",")]
        assert set(names) <= symbols
        passed = len(args.split(",")) + len(names) + k["scratch_params"]
        assert kernel_param_count((pkg / k["file"]).read_bytes(), k["symbol"]) == passed, (k["symbol"], args, sizes)


# ---- on a GPU -------------------------------------------------------------------------------------

NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GPU_CASES = [(name, dtype) for name in MODELS for dtype in ("float32", "bfloat16")]
TOL = {"float32": 1e-4, "bfloat16": 3e-2}


def _gpu_example(name: str, dtype: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = example(name, small=True)
    dt = getattr(torch, dtype)
    model = model.to("cuda", dt)
    torch.manual_seed(seed)
    x = inputs[0]
    x = torch.randint(0, 256, x.shape) if name == "transformer" else torch.randn(x.shape)
    return model, (x.to("cuda", dt if x.is_floating_point() else x.dtype),)


@pytest.fixture(scope="module")
def gpu_work(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each model exported on the GPU in fp32 and bf16, packaged for it, with eager's outputs; the C++ example."""
    d = tmp_path_factory.mktemp("deploy_gpu")
    main = _build_main(d)
    models = {}
    for name, dtype in GPU_CASES:
        model, inputs = _gpu_example(name, dtype)
        report = kiln.package(kiln.export(model, inputs), d / f"{name}-{dtype}", device="cuda")
        print(report.as_text())
        with torch.no_grad():
            expected = model(*inputs)
        save_file({"input0": inputs[0].cpu()}, str(d / f"{name}-{dtype}.in.safetensors"))
        save_file({"output0": expected.float().cpu()}, str(d / f"{name}-{dtype}.out.safetensors"))
        models[(name, dtype)] = model
    out, _ = main.communicate()
    assert main.returncode == 0, out
    return {"dir": d, "main": d / "main", "models": models}


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize(("name", "dtype"), GPU_CASES)
def test_gpu_python_loader_matches_eager(gpu_work: dict, name: str, dtype: str) -> None:
    loaded = kiln.load_package(gpu_work["dir"] / f"{name}-{dtype}")
    model = gpu_work["models"][(name, dtype)]
    for k in range(3):  # fresh inputs each call
        _, (x,) = _gpu_example(name, dtype, seed=100 + k)
        with torch.no_grad():
            want = model(x)
        got = loaded(x)
        assert got.device == want.device and got.dtype == want.dtype
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1.0))


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize(("name", "dtype"), GPU_CASES)
def test_gpu_cpp_runner_matches_eager_without_python(gpu_work: dict, name: str, dtype: str) -> None:
    d = gpu_work["dir"]
    r = subprocess.run([str(gpu_work["main"]), "--cuda", "--tol", str(TOL[dtype]), str(d / f"{name}-{dtype}"),
                        str(d / f"{name}-{dtype}.in.safetensors"), str(d / f"{name}-{dtype}.out.safetensors"), "20"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"output0 shape \[.*\] max_abs_err .* ok", r.stdout), r.stdout
    assert "libpython mapped: no" in r.stdout and "latency_ms median" in r.stdout


@pytest.mark.gpu
@NEEDS_GPU
def test_gpu_bad_inputs(gpu_work: dict) -> None:
    pkg = gpu_work["dir"] / "resnet18-float32"
    r = subprocess.run([str(gpu_work["main"]), "--cuda", str(pkg), "--bad-inputs"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"shape: kiln::Runner::run: input 0 \('x'\): expected shape \[1, 3, 64, 64\], got \[1, 3, 64, 64, 1\]", out)
    assert "dtype: kiln::Runner::run: input 0 ('x'): expected dtype Float, got Double" in out
    assert re.search(r"other device: kiln::Runner::run: input 0 \('x'\) is on cpu, the package runs on cuda:\d", out)
    assert "good: ok" in out
    loaded = kiln.load_package(pkg)
    with pytest.raises(GuardError, match=r"input 0 \('x'\) is on cpu, the package runs on cuda:\d"):
        loaded(torch.randn(1, 3, 64, 64))
    # a misaligned view (triton's kernels assume 16-byte aligned pointers) is copied, not misread
    base = torch.randn(1 * 3 * 64 * 64 + 1, device="cuda")
    x = base[1:].view(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), gpu_work["models"][("resnet18", "float32")](x), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@NEEDS_GPU
def test_gpu_package_for_another_arch_refused(tmp_path: Path) -> None:
    major, minor = torch.cuda.get_device_capability()
    other = 80 if major * 10 + minor != 80 else 90
    # a small model of its own (fast to package twice over)
    model = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.GELU(), torch.nn.LayerNorm(24)).eval().cuda()
    inputs = (torch.randn(5, 8, device="cuda"),)
    kiln.package(kiln.export(model, inputs), tmp_path / "other", device="cuda", options={"cuda_arch": other})
    with pytest.raises(cxx.PackageError, match=rf"compiled for sm_{other}; cuda:\d \(.*\) is sm_{major * 10 + minor}"):
        kiln.load_package(tmp_path / "other")


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_torchvision_resnet18(tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's ResNet-18 at full size (224x224), packaged for this GPU, against eager."""
    models = pytest.importorskip("torchvision.models")
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = models.resnet18().eval().to("cuda", dt)
    x = torch.randn(2, 3, 224, 224, device="cuda", dtype=dt)
    kiln.package(kiln.export(model, (x,)), tmp_path / "tv", device="cuda")
    loaded = kiln.load_package(tmp_path / "tv")
    # fp32 convolutions run in TF32 by default (cudnn.allow_tf32), whose rounding depends on the algorithm
    # cuDNN picks for a layout: compare in true fp32, which the 1e-4 tolerance is for
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    for k in range(3):
        torch.manual_seed(10 + k)
        x = torch.randn(2, 3, 224, 224, device="cuda", dtype=dt)
        with torch.no_grad():
            want = model(x)
        got = loaded(x)
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1.0))


@pytest.mark.gpu
@NEEDS_GPU
def test_gpu_dynamic_package_matches_eager_at_every_size(gpu_work: dict, tmp_path: Path) -> None:
    """The padded transformer exported once on the GPU with a dynamic batch and sequence: from Python and
    from C++ at five sizes (the range's corners, primes) against eager; a size past its range refused."""
    export_one("padded_transformer", tmp_path, small=True, device="cuda")
    pkg = tmp_path / "padded_transformer"
    loaded = kiln.load_package(pkg)
    model, _ = example("padded_transformer", small=True)
    model = model.cuda()
    for k, (batch, seq) in enumerate(DYNAMIC_SIZES):
        ids, keep = (x.cuda() for x in padded_inputs(batch, seq, seed=200 + k))
        with torch.no_grad():
            want = model(ids, keep)
        got = loaded(ids, keep)
        assert got.shape == (batch, seq, 256)
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=TOL["float32"], atol=TOL["float32"] * max(scale, 1.0))
    with pytest.raises(GuardError, match=r"input 0 \('ids'\) dim 1: size 65 is outside the range \[2, 64\]"):
        loaded(*(x.cuda() for x in padded_inputs(3, 65)))
    r = subprocess.run([str(gpu_work["main"]), "--cuda", "--tol", str(TOL["float32"]), str(pkg),
                        str(tmp_path / "padded_transformer.inputs.safetensors"),
                        str(tmp_path / "padded_transformer.expected.safetensors"), "20"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok\n") == len(DYNAMIC_SIZES) and "libpython mapped: no" in r.stdout, r.stdout
