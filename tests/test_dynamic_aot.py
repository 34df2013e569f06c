"""Artifacts with symbolic dims: ``aot_compile`` of a function whose input has a dim marked dynamic,
saved, loaded in another process and called with other sizes (forward and backward); a size outside
the marked range is a GuardError naming the input, the dim and the range."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln
from kiln.runtime import GuardError


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.gelu(x @ w1)
    return (h @ w2).softmax(-1).reshape(x.shape[0], -1)


def _weights(grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(8, 16, generator=g).requires_grad_(grad),
            torch.randn(16, 4, generator=g).requires_grad_(grad))


def _compile(path: Path, grad: bool) -> None:
    w1, w2 = _weights(grad)
    x = torch.randn(5, 8)
    kiln.mark_dynamic(x, 0, min=2, max=64)
    compiled = kiln.compile(mlp, backend="aot_eager", fullgraph=True).aot_compile(((x, w1, w2), {}))
    for n in (2, 9):  # the in-process function serves other sizes too
        y = torch.randn(n, 8)
        torch.testing.assert_close(compiled(y, w1, w2), mlp(y, w1, w2))
    compiled.save_compiled_function(str(path))


_CHILD = textwrap.dedent("""
    import sys, torch
    import kiln.runtime as rt
    sys.path.insert(0, {tests!r})
    from test_dynamic_aot import mlp, _weights
    f = rt.load_compiled_function({path!r})
    grad = {grad!r}
    for n in (2, 3, 17, 64, 31):
        w1, w2 = _weights(grad)
        v1, v2 = _weights(grad)
        x = torch.randn(n, 8)
        out, ref = f(x, w1, w2), mlp(x, v1, v2)
        torch.testing.assert_close(out, ref)
        if grad:
            out.pow(2).sum().backward(); ref.pow(2).sum().backward()
            torch.testing.assert_close(w1.grad, v1.grad); torch.testing.assert_close(w2.grad, v2.grad)
    try:
        f(torch.randn(65, 8), *_weights(grad))
    except rt.GuardError as e:
        print("GUARD", e)
    print("OK")
""")


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_dynamic_artifact_in_another_process(tmp_path: Path, grad: bool) -> None:
    path = tmp_path / "mlp.kiln"
    _compile(path, grad)
    script = _CHILD.format(tests=str(Path(__file__).parent), path=str(path), grad=grad)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout
    guard = next(line for line in done.stdout.splitlines() if line.startswith("GUARD"))
    assert "input 'x' dim 0" in guard and "size 65" in guard and "[2, 64]" in guard


def test_out_of_range_size_is_a_guard_error(tmp_path: Path) -> None:
    w1, w2 = _weights(False)
    x = torch.randn(4, 8)
    kiln.mark_dynamic(x, 0, min=3, max=10)
    f = kiln.compile(mlp, backend="aot_eager", fullgraph=True).aot_compile(((x, w1, w2), {}))
    for n in (3, 10):
        y = torch.randn(n, 8)
        torch.testing.assert_close(f(y, w1, w2), mlp(y, w1, w2))
    with pytest.raises(GuardError, match=r"input 'x' dim 0: size 2 is outside the range \[3, 10\]"):
        f(torch.randn(2, 8), w1, w2)
    with pytest.raises(GuardError):
        f(torch.randn(5, 9), w1, w2)  # a static dim still guards its size


def test_static_artifact_stays_static(tmp_path: Path) -> None:
    w1, w2 = _weights(False)
    f = kiln.compile(mlp, backend="aot_eager", fullgraph=True).aot_compile(((torch.randn(4, 8), w1, w2), {}))
    with pytest.raises(GuardError):
        f(torch.randn(5, 8), w1, w2)


def test_broken_size_relation_is_a_guard_error() -> None:
    def rows(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4).sum(1)
    x = torch.randn(8)
    kiln.mark_dynamic(x, 0)
    f = kiln.compile(rows, backend="aot_eager", fullgraph=True).aot_compile(((x,), {}))
    for n in (4, 12, 40):
        y = torch.randn(n)
        torch.testing.assert_close(f(y), rows(y))
    with pytest.raises(GuardError, match=r"shape relation .*% 4\) == 0\) does not hold for input 'x' dim 0 = 6"):
        f(torch.randn(6))
