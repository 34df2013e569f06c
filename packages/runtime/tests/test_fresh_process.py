"""Artifacts load and run in a fresh Python process: one subprocess (imports are slow) checks an
autograd program with external data (forward and backward), a C++ kernel artifact and a Triton
kernel artifact (under Triton's CPU interpreter)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from runtime_testlib import AUTOGRAD, CPP, CPP_SOURCE, TRITON, TRITON_KERNELS

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import CallFrame, compile_cpp, save_artifact
from kiln.runtime.tensors import tensors_from_bytes, tensors_to_bytes

HAVE_TRITON = importlib.util.find_spec("triton") is not None
HAVE_GXX = shutil.which("g++") is not None

LOADER = textwrap.dedent('''
    import os, sys, torch
    from kiln.runtime import load_compiled_function
    from kiln.runtime.tensors import tensors_from_bytes, tensors_to_bytes
    tmp = sys.argv[1]
    inputs = tensors_from_bytes(open(f"{tmp}/in.st", "rb").read())
    model = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(inputs["w"])
    fn = load_compiled_function(f"{tmp}/f.kiln", external_data={"net": model})
    out = fn(inputs["x"])[0]
    out.sum().backward()
    results = {"out": out.detach(), "grad": model.weight.grad}
    a, b = torch.arange(300, dtype=torch.float32), torch.ones(300)
    for name in ("cpp", "triton"):
        if os.path.exists(f"{tmp}/{name}.kiln"):
            results[name] = load_compiled_function(f"{tmp}/{name}.kiln")(a, b)[0]
    open(f"{tmp}/out.st", "wb").write(tensors_to_bytes(results))
    others = sorted(m for m in sys.modules if m.startswith("kiln.")
                    and not m.startswith(("kiln.runtime", "kiln.graph")))
    compiler = sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor")))
    print("other modules:", others, compiler)
''')


def _save_kernel_artifacts(tmp_path) -> list[str]:
    spec = TensorSpec((300,), torch.float32, torch.device("cpu"), (1,))
    saved = []
    if HAVE_GXX:
        files = {"kernels/add.so": compile_cpp(CPP_SOURCE), "kernels/add.cpp": CPP_SOURCE.encode()}
        save_artifact(tmp_path / "cpp.kiln", PortableProgram(CPP, files=files),
                      input_names=["a", "b"], input_specs=[spec, spec])
        saved.append("cpp")
    if HAVE_TRITON:
        program = PortableProgram(TRITON, files={"kernels.py": TRITON_KERNELS.encode()},
                                  requires=("torch", "triton"))
        save_artifact(tmp_path / "triton.kiln", program, input_names=["a", "b"],
                      input_specs=[spec, spec])
        saved.append("triton")
    return saved


def test_load_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8)

    def f(x):
        return model(x)

    save_artifact(tmp_path / "f.kiln", PortableProgram(AUTOGRAD), frame=CallFrame.of(f, (x,)),
                  external_data={"net": model}, input_sources=["L['model'].weight", "L['x']"],
                  input_specs=[TensorSpec.from_tensor(model.weight), TensorSpec.from_tensor(x)])
    kernels = _save_kernel_artifacts(tmp_path)
    (tmp_path / "in.st").write_bytes(tensors_to_bytes({"w": model.weight.detach(), "x": x}))
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "other modules: [] []" in proc.stdout  # loading needs no other kiln stage, no compiler
    got = tensors_from_bytes((tmp_path / "out.st").read_bytes())
    want = torch.tanh(model(x))
    want.sum().backward()
    torch.testing.assert_close(got["out"], want.detach())
    torch.testing.assert_close(got["grad"], model.weight.grad)
    a, b = torch.arange(300, dtype=torch.float32), torch.ones(300)
    for name in kernels:
        torch.testing.assert_close(got[name], a + 2 * b)
    if not HAVE_TRITON:
        pytest.skip("triton is not installed: only the autograd and C++ artifacts were checked")
