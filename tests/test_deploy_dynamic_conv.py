"""Symbolic spatial dims through convolutions and pooling, and relations between input sizes, in packages.

The example's ResNet-18-shaped CNN (width 16: convolutions, batch norm, ReLU, max pool, adaptive average
pool, linear) is exported once on CPU with its batch, height and width dynamic, and run from Python
(kiln.load_package) and from C++ (examples/deploy_cpp/main.cpp) at sizes including odd and prime ones,
against eager; kiln.compile's automatic dynamic shapes serve a stream of image sizes with two graphs.
A package whose inputs must satisfy relations (``s0 == 2*s1``; ``s1 <= s0``) refuses a call that breaks
one, from Python and from C++, naming the relation, the inputs and their dims; a range whose end a
derived size cannot serve (a pooled size that becomes 1) is refused at export.
Under torch 2.11's pooled-size division (whose ``x % stride != 0`` test guarded the parity of the image
size on the H200) the CNN still exports over the whole range and packages for CUDA without a GPU.
On a GPU (``-m gpu``): the same CNN packaged for CUDA with dynamic batch, height and width.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import kiln
import kiln.capture as kc
import kiln.runtime.cxx as cxx
from kiln.deploy import ExportError
from kiln.runtime import GuardError, KernelBuildError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from models import example  # noqa: E402

NEEDS_GXX = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build packages")
# batch, height and width; the height and width from 33: at 32 the last stage's map is 1x1, which the
# graph traced for larger images does not serve (test_export_refuses_a_range_end_a_derived_size_cannot_serve)
CNN_DYNAMIC = {"x": {0: (2, 8), 2: (33, 256), 3: (33, 256)}}
CNN_SIZES = ((3, 64, 64), (2, 33, 47), (5, 97, 61), (8, 256, 256), (2, 255, 33), (7, 128, 95))
TOL = 1e-5


def cnn_input(batch: int, h: int, w: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(seed))


def pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x's size is twice y's (the trace relates them: s0 == 2*s1)."""
    return x * torch.cat([y, y])


def prefix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y's size is at most x's (narrow's bound: s1 <= s0)."""
    return x.narrow(0, 0, y.shape[0]) + y


def _build_main(d: Path, cuda: bool = False) -> subprocess.Popen:
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", *(["--cuda"] if cuda else []), "--cflags",
                            "--ldflags"], capture_output=True, text=True, check=True).stdout.split()
    return subprocess.Popen(["g++", "-O1", str(EXAMPLE / "main.cpp"), *flags, "-o", str(d / "main")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The CNN package (batch, height, width dynamic) with a case per size for main.cpp; the two relation
    packages; the C++ program (built while the packages build)."""
    d = tmp_path_factory.mktemp("deploy_dynamic_conv")
    main = _build_main(d)
    model, _ = example("resnet18", small=True)
    first = cnn_input(*CNN_SIZES[0], seed=0)
    report = kiln.package(kiln.export(model, (first,), dynamic_shapes=CNN_DYNAMIC), d / "cnn")
    print(report.as_text())
    ins, outs = {}, {}
    for c, size in enumerate(CNN_SIZES):
        x = cnn_input(*size, seed=c)
        with torch.no_grad():
            want = model(x)
        p = f"case{c}/" if c else ""
        ins[f"{p}input0"], outs[f"{p}output0"] = x, want
    save_file(ins, str(d / "cnn.inputs.safetensors"))
    save_file(outs, str(d / "cnn.expected.safetensors"))
    kiln.package(kiln.export(pair, (torch.randn(8), torch.randn(4)),
                             dynamic_shapes={"x": {0: (4, 64)}, "y": {0: (2, 32)}}), d / "pair")
    kiln.package(kiln.export(prefix, (torch.randn(8), torch.randn(4)),
                             dynamic_shapes={"x": {0: (2, 64)}, "y": {0: (2, 64)}}), d / "prefix")
    out, _ = main.communicate()
    assert main.returncode == 0, out
    return {"dir": d, "main": d / "main", "model": model}


def run_main(work: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(work["main"]), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@NEEDS_GXX
def test_cnn_manifest_names_batch_height_and_width(work: dict[str, Any]) -> None:
    m = json.loads((work["dir"] / "cnn" / cxx.MANIFEST).read_text())
    assert {(s["name"], s["dim"]): (s["min"], s["max"]) for s in m["sizes"]} == {
        ("x", 0): (2, 8), ("x", 2): (33, 256), ("x", 3): (33, 256)}
    (x,) = m["inputs"]
    assert isinstance(x["shape"][0], str) and x["shape"][1] == 3 and all(isinstance(n, str) for n in x["shape"][2:])
    assert m["outputs"][0]["shape"] == [x["shape"][0], 100]
    # the convolutions' and pools' output sizes are computed in model.so from the symbols, C's / on
    # non-negative operands: (H - 1)//2 + 1 as (H + 1)//2
    kernels = (work["dir"] / "cnn" / "src" / "kernels.cpp").read_text()
    h = x["shape"][2]
    assert f"((1 + {h}) / 2)" in kernels and f"((31 + {h}) / 32)" in kernels


@pytest.mark.slow
@NEEDS_GXX
def test_cnn_python_loader_matches_eager_at_every_size(work: dict[str, Any]) -> None:
    loaded = kiln.load_package(work["dir"] / "cnn")
    for k, size in enumerate(CNN_SIZES):  # fresh inputs at each size
        x = cnn_input(*size, seed=100 + k)
        with torch.no_grad():
            want = work["model"](x)
        got = loaded(x)
        assert got.shape == (size[0], 100)
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    with pytest.raises(GuardError, match=r"input 0 \('x'\) dim 2: size 257 is outside the range \[33, 256\]"):
        loaded(cnn_input(2, 257, 64, seed=0))
    with pytest.raises(GuardError, match=r"input 0 \('x'\) dim 3: size 32 is outside the range \[33, 256\]"):
        loaded(cnn_input(2, 64, 32, seed=0))


@pytest.mark.slow
@NEEDS_GXX
def test_cnn_cpp_runner_matches_eager_at_every_size(work: dict[str, Any]) -> None:
    d = work["dir"]
    r = run_main(work, "--tol", str(TOL), str(d / "cnn"), str(d / "cnn.inputs.safetensors"),
                 str(d / "cnn.expected.safetensors"), "2")
    assert r.returncode == 0, r.stdout + r.stderr
    shapes = re.findall(r"output0 shape \[(\d+), 100\] max_abs_err (\S+) \(max \|expected\| \S+\) ok", r.stdout)
    assert [int(b) for b, _ in shapes] == [b for b, _, _ in CNN_SIZES], r.stdout
    assert max(float(e) for _, e in shapes) <= TOL, r.stdout
    assert "MISMATCH" not in r.stdout and "libpython mapped: no" in r.stdout
    r = run_main(work, str(d / "cnn"), "--shapes", "2x3x40x300")
    assert r.returncode == 3 and "input 0 ('x') dim 3: size 300 is outside the range [33, 256]" in r.stderr, r.stderr


@pytest.mark.slow
@NEEDS_GXX
def test_relation_between_inputs_checked_by_both_runners(work: dict[str, Any]) -> None:
    """``x`` is twice ``y``: the manifest lists the relation; a call that breaks it is refused by model.so
    (through either runner) with the relation and each size's input and dim."""
    pkg = work["dir"] / "pair"
    m = json.loads((pkg / cxx.MANIFEST).read_text())
    (rel,) = [g["expr"] for g in m["guards"] if g["kind"] == "size_relation"]
    assert re.fullmatch(r"s\d+ == 2\*s\d+", rel), rel
    assert re.fullmatch(r"2\*s\d+", m["inputs"][0]["shape"][0]) and m["inputs"][1]["shape"][0] in rel
    loaded = kiln.load_package(pkg)
    for n in (2, 3, 17, 32):  # fresh inputs at each size
        x, y = torch.randn(2 * n), torch.randn(n)
        torch.testing.assert_close(loaded(x, y), pair(x, y))
    broken = (r"the input sizes break a relation the program was exported for: s\d+ == 2\*s\d+; sizes: s\d+ = 9 "
              r"\(input 'x' dim 0\), s\d+ = 4 \(input 'y' dim 0\)")
    with pytest.raises(GuardError, match=broken):
        loaded(torch.randn(9), torch.randn(4))
    r = run_main(work, str(pkg), "--shapes", "9", "4")
    assert r.returncode == 3 and re.search("kiln::Runner::run: .*" + broken, r.stderr), r.stdout + r.stderr
    r = run_main(work, str(pkg), "--shapes", "10", "5")
    assert r.returncode == 0 and "output0 shape [10]" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
@NEEDS_GXX
def test_inequality_between_inputs_checked_by_both_runners(work: dict[str, Any]) -> None:
    """``y`` may not be longer than ``x`` (narrow reads its first len(y) elements): a longer one is refused
    before any kernel reads past ``x``."""
    pkg = work["dir"] / "prefix"
    m = json.loads((pkg / cxx.MANIFEST).read_text())
    assert [g["expr"] for g in m["guards"] if g["kind"] == "size_relation"], m["guards"]
    loaded = kiln.load_package(pkg)
    for nx, ny in ((2, 2), (9, 4), (64, 63), (64, 64)):
        x, y = torch.randn(nx), torch.randn(ny)
        torch.testing.assert_close(loaded(x, y), prefix(x, y))
    broken = (r"the input sizes break a relation the program was exported for: 0 <= s\d+ - s\d+; sizes: "
              r"s\d+ = 5 \(input 'x' dim 0\), s\d+ = 7 \(input 'y' dim 0\)")
    with pytest.raises(GuardError, match=broken):
        loaded(torch.randn(5), torch.randn(7))
    r = run_main(work, str(pkg), "--shapes", "5", "7")
    assert r.returncode == 3 and re.search(broken, r.stderr), r.stdout + r.stderr


def test_export_serves_a_derived_size_of_one_unless_the_program_asks_for_it() -> None:
    """Pooled by 4, heights 4..7 give a 1-row map. ``p * p`` means the same at one row (a size-1 question
    of a broadcast between equal sizes needs no guard), so the range [4, 64] exports and serves it; a
    program that branches on the row count is refused at export, naming the relation; from 8 it exports."""
    def pooled(x: torch.Tensor) -> torch.Tensor:
        p = F.max_pool2d(x, 4)
        return p * p

    def branchy(x: torch.Tensor) -> torch.Tensor:
        p = F.max_pool2d(x, 4)
        if p.shape[2] == 1:
            return p * 2
        return p * p

    x = torch.randn(1, 2, 16, 16)
    exported = kiln.export(pooled, (x,), dynamic_shapes={"x": {2: (4, 64)}})
    for h in (4, 5, 8, 13, 64):
        y = torch.randn(1, 2, h, 16)
        torch.testing.assert_close(exported(y), pooled(y))
    with pytest.raises(ExportError, match=r"input 'x' dim 2 was to vary in \[4, 64\], but the program was traced or "
                                          r"compiled assuming \(s\d+ // 4\) != 1, which fails at size 4"):
        kiln.export(branchy, (x,), dynamic_shapes={"x": {2: (4, 64)}})
    exported = kiln.export(branchy, (x,), dynamic_shapes={"x": {2: (8, 64)}})
    for h in (8, 13, 64):
        y = torch.randn(1, 2, h, 16)
        torch.testing.assert_close(exported(y), branchy(y))


@pytest.mark.slow
def test_compile_serves_a_stream_of_image_sizes_with_two_graphs() -> None:
    """Automatic dynamic shapes: the first size compiles a static graph, the second a graph symbolic in
    batch, height and width that serves every later size (odd ones too)."""
    model, _ = example("resnet18", small=True)
    cf = kiln.compile(model)
    for k, size in enumerate(((2, 64, 64), *CNN_SIZES[1:], (4, 63, 64))):
        x = cnn_input(*size, seed=300 + k)
        with torch.no_grad():
            torch.testing.assert_close(cf(x), model(x), rtol=TOL, atol=TOL)
    assert len(kc.cache_entries(cf._compiled_forward)) == 2


# torch 2.11's torch._meta_registrations.div_rtn, which the pooling meta kernels divide with: on SymInts
# its ``r != 0`` guards the parity of the pooled size (the H200 runs torch 2.11)
TORCH_2_11_POOLING = textwrap.dedent("""
    import torch._meta_registrations as torch_meta
    def div_rtn(x, y):
        q = x // y
        r = x % y
        if r != 0 and (bool(r < 0) != bool(y < 0)):
            q -= 1
        return q
    torch_meta.div_rtn = div_rtn
""")

PARITY_EXPORT = TORCH_2_11_POOLING + textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {example!r})
    import kiln
    from models import example
    model, _ = example("resnet18", small=True)
    x = torch.randn(3, 3, 64, 64)
    exported = kiln.export(model, (x,), dynamic_shapes={dynamic!r})
    for k, (b, h, w) in enumerate({sizes!r}):  # fresh inputs, both parities of each pooled size
        y = torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(500 + k))
        with torch.no_grad():
            torch.testing.assert_close(exported(y), model(y), rtol={tol}, atol={tol})
    print(kiln.package(exported, {out!r}, device="cuda", options={{"cuda_arch": 90}}).as_text())
""")


def _no_cuda_build() -> str:
    """Why CUDA packages cannot be built here ("" when they can)."""
    try:
        cxx.cuda_include_dirs()
        cxx.ldflags(cuda=True)
    except KernelBuildError as e:
        return f"CUDA packages cannot be built with this torch: {e}"
    return ""


@pytest.mark.slow
@NEEDS_GXX
@pytest.mark.skipif(bool(_no_cuda_build()), reason=_no_cuda_build() or "-")
def test_cnn_exports_and_packages_for_cuda_over_both_parities_with_torch_2_11_pooling(tmp_path: Path) -> None:
    """The H200's failure without a GPU: torch 2.11's pooling meta kernels recorded
    ``(((H + 1) // 2) + 1) % 2 != 0`` (the max pool after the stride-2 stem), and kiln.export refused the
    range; the CUDA package's schedule ran the same kernels again. Exported on CPU and packaged for sm_90
    in a process running torch 2.11's helper: no relation over the sizes, and the exported graph matches
    eager at odd and even sizes."""
    sizes = ((2, 33, 47), (5, 97, 64), (8, 256, 255), (3, 34, 35))
    script = PARITY_EXPORT.format(example=str(EXAMPLE), dynamic=CNN_DYNAMIC, sizes=sizes, tol=TOL,
                                  out=str(tmp_path / "cnn"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # cubins by triton's compiler
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    m = json.loads((tmp_path / "cnn" / cxx.MANIFEST).read_text())
    assert m["device"] == "cuda" and m["kernels"]
    assert [g["expr"] for g in m["guards"] if g["kind"] == "size_relation"] == []
    assert {(s["name"], s["dim"]): (s["min"], s["max"]) for s in m["sizes"]} == {
        ("x", 0): (2, 8), ("x", 2): (33, 256), ("x", 3): (33, 256)}


# ---- on a GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@NEEDS_GXX
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_cnn_with_dynamic_height_and_width(tmp_path: Path) -> None:
    """The CNN exported on the GPU with batch, height and width dynamic, packaged for it: from Python and
    from C++ at every size against eager."""
    main = _build_main(tmp_path, cuda=True)
    model, _ = example("resnet18", small=True)
    model = model.cuda()
    x0 = cnn_input(*CNN_SIZES[0], seed=0).cuda()
    print(kiln.package(kiln.export(model, (x0,), dynamic_shapes=CNN_DYNAMIC), tmp_path / "cnn", device="cuda")
          .as_text())
    loaded = kiln.load_package(tmp_path / "cnn")
    ins, outs = {}, {}
    for k, size in enumerate(CNN_SIZES):
        x = cnn_input(*size, seed=400 + k).cuda()
        with torch.no_grad():
            want = model(x)
        got = loaded(x)
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(scale, 1.0))
        p = f"case{k}/" if k else ""
        ins[f"{p}input0"], outs[f"{p}output0"] = x.cpu(), want.cpu()
    save_file(ins, str(tmp_path / "in.safetensors"))
    save_file(outs, str(tmp_path / "out.safetensors"))
    out, _ = main.communicate()
    assert main.returncode == 0, out
    r = subprocess.run([str(tmp_path / "main"), "--cuda", "--tol", "1e-4", str(tmp_path / "cnn"),
                        str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"), "5"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok\n") == len(CNN_SIZES) and "libpython mapped: no" in r.stdout, r.stdout
