"""Dynamic shapes through kiln.export / kiln.package on CPU: the example's padded transformer exported
once with a dynamic batch and sequence dim (``models.DYNAMIC``: its two inputs share both dims), run
from C++ (examples/deploy_cpp/main.cpp) and from Python (kiln.load_package) at five sizes -- the range's
corners and primes -- and compared with eager; a size outside its range, two related sizes that differ
and a broken divisibility relation are refused with messages naming the input, the dim and the range
or relation."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
import kiln.runtime.cxx as cxx
from kiln.runtime import GuardError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
sys.path.insert(0, str(EXAMPLE))
from export_models import export_one  # noqa: E402
from models import DYNAMIC_SIZES, example, padded_inputs  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build packages")]
NAME = "padded_transformer"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The package (exported once, dynamic batch and sequence), its cases, and the C++ program (built
    while the package builds)."""
    d = tmp_path_factory.mktemp("deploy_dynamic")
    flags = subprocess.run([sys.executable, "-m", "kiln.runtime.cxx", "--cflags", "--ldflags"],
                           capture_output=True, text=True, check=True).stdout.split()
    main = subprocess.Popen(["g++", "-O1", str(EXAMPLE / "main.cpp"), *flags, "-o", str(d / "main")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    export_one(NAME, d, small=True)
    out, _ = main.communicate()
    assert main.returncode == 0, out
    model, _ = example(NAME, small=True)
    return {"dir": d, "main": d / "main", "pkg": d / NAME, "model": model}


def run_main(work: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(work["main"]), *args], capture_output=True, text=True, timeout=300)


def test_manifest_records_symbols_ranges_and_relations(work: dict) -> None:
    m = json.loads((work["pkg"] / cxx.MANIFEST).read_text())
    sizes = {(s["name"], s["dim"]): (s["min"], s["max"]) for s in m["sizes"]}
    assert sizes == {("ids", 0): (2, 8), ("ids", 1): (2, 64), ("keep", 0): (2, 8), ("keep", 1): (2, 64)}
    ids, keep = m["inputs"]
    assert all(isinstance(n, str) for n in ids["shape"]) and ids["shape"] == keep["shape"]  # one symbol per shared dim
    assert m["outputs"][0]["shape"][:2] == ids["shape"] and m["outputs"][0]["shape"][2] == 256
    kinds = [g["kind"] for g in m["guards"]]
    assert kinds.count("size_range") == 4 and kinds.count("size_relation") == 2
    assert "model.so" in m["files"] and m["abi_version"] == 4


def test_cpp_runner_matches_eager_at_every_size(work: dict) -> None:
    d = work["dir"]
    r = run_main(work, "--tol", "1e-5", str(work["pkg"]), str(d / f"{NAME}.inputs.safetensors"),
                 str(d / f"{NAME}.expected.safetensors"), "3")
    assert r.returncode == 0, r.stdout + r.stderr
    shapes = re.findall(r"output0 shape \[(\d+), (\d+), 256\] max_abs_err \S+ \(max \|expected\| \S+\) ok", r.stdout)
    assert [(int(b), int(t)) for b, t in shapes] == list(DYNAMIC_SIZES), r.stdout
    assert "MISMATCH" not in r.stdout and "libpython mapped: no" in r.stdout


def test_cpp_runner_refuses_out_of_range_and_unrelated_sizes(work: dict) -> None:
    r = run_main(work, str(work["pkg"]), "--bad-inputs")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert ("range: kiln::Runner::run: input 0 ('ids') dim 0: size 9 is outside the range [2, 8] the package was "
            "exported for") in out
    assert re.search(r"relation: kiln::Runner::run: input 1 \('keep'\) dim 0: size 3 must equal input 0 \('ids'\) "
                     r"dim 0, size 2 \(the program relates these sizes: both are s\d+\)", out), out
    assert re.search(r"shape: .*input 0 \('ids'\): expected shape \[s\d+, s\d+\], got \[2, 2, 1\]", out), out
    assert "good: ok" in out


def test_python_loader_matches_eager_at_every_size(work: dict) -> None:
    loaded = kiln.load_package(work["pkg"])
    for k, (batch, seq) in enumerate(DYNAMIC_SIZES):  # fresh inputs at each size
        ids, keep = padded_inputs(batch, seq, seed=100 + k)
        with torch.no_grad():
            want = work["model"](ids, keep)
        got = loaded(ids, keep)
        assert got.shape == (batch, seq, 256)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ids, keep = padded_inputs(4, 9, seed=7)  # a non-contiguous input is made contiguous
    keep_t = keep.t().contiguous().t()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, keep_t), work["model"](ids, keep), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("batch", "seq", "message"), [
    (9, 5, r"input 0 \('ids'\) dim 0: size 9 is outside the range \[2, 8\]"),
    (1, 5, r"input 0 \('ids'\) dim 0: size 1 is outside the range \[2, 8\]"),
    (3, 65, r"input 0 \('ids'\) dim 1: size 65 is outside the range \[2, 64\]"),
])
def test_python_loader_refuses_out_of_range(work: dict, batch: int, seq: int, message: str) -> None:
    loaded = kiln.load_package(work["pkg"])
    with pytest.raises(GuardError, match=message):
        loaded(*padded_inputs(batch, seq))


def test_python_loader_refuses_unrelated_sizes(work: dict) -> None:
    loaded = kiln.load_package(work["pkg"])
    ids, _ = padded_inputs(3, 10)
    with pytest.raises(GuardError, match=r"input 1 \('keep'\) dim 1: size 11 must equal input 0 \('ids'\) dim 1, "
                                         r"size 10 \(the program relates these sizes"):
        loaded(ids, torch.ones(3, 11))
    with pytest.raises(GuardError, match=r"input 1 \('keep'\): expected shape \[s\d+, s\d+\], got \[3, 10, 1\]"):
        loaded(ids, torch.ones(3, 10, 1))


def rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 4).sum(1)


def test_model_library_checks_the_relations_the_program_assumed(tmp_path: Path) -> None:
    """A relation that is no equality of input dims (a reshape's divisibility) is checked by model.so."""
    kiln.package(kiln.export(rows, (torch.randn(8),), dynamic_shapes={"x": {0: (4, 64)}}), tmp_path / "rows")
    m = json.loads((tmp_path / "rows" / cxx.MANIFEST).read_text())
    assert any(g["kind"] == "size_relation" and re.fullmatch(r"\(s\d+ % 4\) == 0", g["expr"]) for g in m["guards"])
    loaded = kiln.load_package(tmp_path / "rows")
    for n in (4, 12, 40, 64):
        x = torch.randn(n)
        torch.testing.assert_close(loaded(x), rows(x))
    with pytest.raises(GuardError, match=r"the input sizes break a relation the program was exported for: "
                                         r"\(s\d+ % 4\) == 0; sizes: s\d+ = 6 \(input 'x' dim 0\)"):
        loaded(torch.randn(6))


def test_convolutional_network_with_a_dynamic_batch(tmp_path: Path) -> None:
    """The ResNet-18-shaped CNN (convolutions, batch norm, pooling) for every batch in [2, 8]."""
    model, _ = example("resnet18", small=True)
    exported = kiln.export(model, (torch.randn(3, 3, 64, 64),), dynamic_shapes={"x": {0: (2, 8)}})
    kiln.package(exported, tmp_path / "resnet")
    loaded = kiln.load_package(tmp_path / "resnet")
    for batch in (2, 3, 7, 8):
        torch.manual_seed(batch)
        x = torch.randn(batch, 3, 64, 64)
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-5)

