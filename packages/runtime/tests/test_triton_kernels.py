"""Triton kernels shipped as source (the fresh-process test runs one under the CPU interpreter)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from runtime_testlib import TRITON, TRITON_KERNELS

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import CompileCache, KernelBuildError, load_triton_kernel, save_artifact

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def test_kernel_source_becomes_an_importable_file(tmp_path):
    cache = CompileCache(tmp_path / "c")
    kernel = load_triton_kernel(TRITON_KERNELS, "add_kernel", cache=cache)
    assert kernel is load_triton_kernel(TRITON_KERNELS, "add_kernel", cache=cache)  # once per text
    files = list((tmp_path / "c" / "v1" / "files" / "triton_src").glob("*.py"))
    assert len(files) == 1 and files[0].read_text() == TRITON_KERNELS
    with pytest.raises(KernelBuildError, match="no kernel named 'mul_kernel'"):
        load_triton_kernel(TRITON_KERNELS, "mul_kernel", cache=cache)
    with pytest.raises(KernelBuildError, match="failed to import"):
        load_triton_kernel("import triton\nthis is not python\n", "k", cache=cache)


RUNNER = textwrap.dedent('''
    import sys, torch
    from kiln.runtime import load_compiled_function
    fn = load_compiled_function(sys.argv[1])
    a = torch.arange(300, dtype=torch.float32, device="cuda")
    b = torch.ones(300, device="cuda")
    torch.testing.assert_close(fn(a, b)[0], a + 2 * b)
    print("triton ok")
''')


@pytest.mark.gpu
def test_cross_compiled_triton_artifact_runs_on_the_gpu(tmp_path):
    """Saved from specs alone (no device needed); Triton compiles the kernel on first call."""
    spec = TensorSpec((300,), torch.float32, torch.device("cuda"), (1,))
    program = PortableProgram(TRITON, files={"kernels.py": TRITON_KERNELS.encode()},
                              requires=("torch", "triton"))
    save_artifact(tmp_path / "t.kiln", program, input_names=["a", "b"], input_specs=[spec, spec])
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "t.kiln")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "triton ok" in proc.stdout
