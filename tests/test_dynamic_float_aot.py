"""``aot_compile`` with ``dynamic=True`` of a function taking a Python float: the float is a symbolic input
of the artifact (not a constant fixed at compile time), a guard the program assumed on it (``s >= 0``) is
kept as data, checked on every call, and a value violating it is a GuardError naming the input -- in the
compiling process and after the artifact is loaded in another one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.runtime import GuardError

VALUES = (0.5, 0.25, 1 / 3, 3.0, 0.0, 1e-3)


def branchy(x: torch.Tensor, s: float) -> torch.Tensor:
    if s >= 0:  # a guard on the float symbol
        return x * s + 1
    return x - s


@pytest.mark.slow
@pytest.mark.parametrize("options", [pytest.param({}, id="python_wrapper"),
                                     pytest.param({"wrapper": "cpp"}, id="cpp_wrapper")])
def test_float_argument_of_an_aot_artifact(options, tmp_path) -> None:
    compiled = kiln.compile(branchy, fullgraph=True, dynamic=True, options=options).aot_compile(
        ((torch.randn(3, 4), 0.5), {}))
    for v in VALUES:
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x, v), branchy(x, v), msg=lambda m, v=v: f"s={v}: {m}")
    with pytest.raises(GuardError, match=r"input 's' = -1\.0"):
        compiled(torch.randn(3, 4), -1.0)
    path = tmp_path / "branchy.kiln"
    compiled.save_compiled_function(path)
    script = textwrap.dedent(f"""
        import torch
        import kiln.runtime as runtime
        loaded = runtime.load_compiled_function({str(path)!r})
        for v in {VALUES!r}:
            x = torch.randn(3, 4)
            torch.testing.assert_close(loaded(x, v), x * v + 1)
        try:
            loaded(torch.randn(3, 4), -2.5)
        except runtime.GuardError as e:
            assert "input 's'" in str(e), e
            print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
