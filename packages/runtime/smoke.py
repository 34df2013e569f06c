"""Smoke test of kiln-runtime installed alone (with kiln-graph): save and load a program."""

import tempfile
from pathlib import Path

import torch

import kiln.runtime as runtime
from kiln.graph import PortableProgram, TensorSpec

program = PortableProgram("import torch\n\ndef call(args):\n    return (torch.sin(args[0]) * 2,)\n")
x = torch.randn(3)
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "f.kiln"
    runtime.save_artifact(path, program, input_names=["x"], input_specs=[TensorSpec.from_tensor(x)])
    f = runtime.load_compiled_function(path)
    torch.testing.assert_close(f(x)[0], torch.sin(x) * 2)
    try:
        f(torch.randn(4))
    except runtime.GuardError as e:
        assert "x" in str(e)
    else:
        raise AssertionError("a wrong-shaped input must raise GuardError")
print("kiln-runtime alone: ok")
