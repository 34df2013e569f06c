"""Version, device and host checks on load."""

from __future__ import annotations

import pytest
import torch
from runtime_testlib import MATMUL, reseal

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import (
    ArtifactError,
    DeviceInfo,
    load_artifact,
    load_compiled_function,
    save_artifact,
)
from kiln.runtime.environment import compatible_release, release


@pytest.fixture
def artifact_dir(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    save_artifact(tmp_path / "d", PortableProgram(MATMUL), input_names=["w", "x"], format="dir",
                  input_specs=[TensorSpec.from_tensor(w), TensorSpec.from_tensor(x)])
    return tmp_path / "d"


def test_release_parsing():
    assert release("2.15.0+cu132") == (2, 15)
    assert release("3.9.0.dev20260101") == (3, 9)
    assert compatible_release("1.2.0", "1.5.1") and not compatible_release("1.2.0", "2.0.0")
    assert compatible_release("0.1.0", "0.1.7") and not compatible_release("0.1.0", "0.2.0")


def test_torch_version_mismatch(artifact_dir):
    reseal(artifact_dir, lambda d: d["environment"].update(torch="1.13.1"))
    with pytest.raises(ArtifactError, match=r"compiled with torch 1\.13\.1, but this is torch 2\.\d+"):
        load_compiled_function(artifact_dir)
    art = load_artifact(artifact_dir, check_compatibility=False)  # still inspectable
    assert "torch 1.13.1" in art.as_text()


def test_kiln_runtime_version_mismatch(artifact_dir):
    reseal(artifact_dir, lambda d: d["environment"]["kiln"].update({"kiln-runtime": "7.0.0"}))
    with pytest.raises(ArtifactError, match="written by kiln-runtime 7.0.0, which is not compatible"):
        load_compiled_function(artifact_dir)


def test_triton_version_mismatch(artifact_dir):
    def edit(d):
        d["program"]["requires"] = ["torch", "triton"]
        d["environment"]["triton"] = "1.0.0"

    reseal(artifact_dir, edit)
    with pytest.raises(ArtifactError, match=r"compiled with triton 1\.0\.0, but this is triton"):
        load_compiled_function(artifact_dir)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without CUDA")
def test_cuda_artifact_on_a_cpu_host(artifact_dir):
    reseal(artifact_dir, lambda d: d.update(device=DeviceInfo("cuda", (9, 0), "H100").to_json()))
    with pytest.raises(ArtifactError, match=r"compiled for cuda \(H100, sm_90\), but this machine has "
                                            "no CUDA device"):
        load_compiled_function(artifact_dir)


@pytest.mark.gpu
def test_newer_gpu_capability_is_refused(artifact_dir):
    reseal(artifact_dir, lambda d: d.update(device=DeviceInfo("cuda", (99, 0), "future").to_json()))
    with pytest.raises(ArtifactError, match="which is older; recompile on this machine"):
        load_compiled_function(artifact_dir)


def test_python_version_is_recorded_not_enforced(artifact_dir):
    reseal(artifact_dir, lambda d: d["environment"].update(python="3.99.0"))
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    torch.testing.assert_close(load_compiled_function(artifact_dir)(w, x)[0], x @ w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks cross-compilation on a CPU-only host")
def test_cross_compiled_cuda_artifact_records_the_target(tmp_path):
    spec = TensorSpec((4, 8), torch.float32, torch.device("cuda:0"), (8, 1))  # no GPU needed to save
    art = save_artifact(tmp_path / "c.kiln", PortableProgram(MATMUL), input_names=["w", "x"],
                        input_specs=[spec, spec])
    assert art.manifest.device == DeviceInfo("cuda")  # capability unknown: kernels finish on load
    with pytest.raises(ArtifactError, match="no CUDA device"):
        load_compiled_function(tmp_path / "c.kiln")


def test_runtime_version_constant_matches_the_installed_distribution() -> None:
    import importlib.metadata

    from kiln.runtime.environment import RUNTIME_VERSION

    assert RUNTIME_VERSION == importlib.metadata.version("kiln-runtime")
