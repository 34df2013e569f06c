"""torch.compile's AOT documentation examples, run with kiln: free function, module forward with
backward, closure, training loop, save and load in another process, backward after load."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import kiln
from kiln.runtime import GuardError

BACKENDS = ["eager", "aot_eager", "inductor"]


def f(x, y):
    return x.sin() + y.cos() * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_free_function(backend: str) -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    compiled = kiln.compile(f, fullgraph=True, backend=backend).aot_compile(((x, y), {}))
    torch.testing.assert_close(compiled(x, y), f(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_forward_with_backward(backend: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    ref = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 8)
    compiled = kiln.compile(model, fullgraph=True, backend=backend).forward.aot_compile(((x,), {}))
    compiled(model, x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_closure_is_saved() -> None:
    scale = torch.tensor(3.0)

    def g(x):
        return x * scale + 1

    x = torch.randn(6)
    compiled = kiln.compile(g, fullgraph=True, backend="inductor").aot_compile(((x,), {}))
    torch.testing.assert_close(compiled(x), g(x))


def test_training_loop_sees_updated_parameters() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    ref = nn.Linear(4, 1)
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    compiled = kiln.compile(model, fullgraph=True, backend="aot_eager").forward.aot_compile(((x,), {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        (compiled(model, x) - y).pow(2).mean().backward()
        (ref(x) - y).pow(2).mean().backward()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(model.weight, ref.weight)


def test_wrong_shape_is_a_guard_error_naming_the_input() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    compiled = kiln.compile(f, fullgraph=True, backend="eager").aot_compile(((x, y), {}))
    with pytest.raises(GuardError, match="'y'"):
        compiled(x, torch.randn(4, 9))
    compiled.disable_guard_check()


def test_save_load_in_another_process_and_backward(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    x = torch.randn(3, 8)
    compiled = kiln.compile(model, fullgraph=True, backend="inductor").forward.aot_compile(((x,), {}))
    path = tmp_path / "model.kiln"
    compiled.save_compiled_function(path)
    torch.save({"state": model.state_dict(), "x": x}, tmp_path / "data.pt")
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        import kiln.runtime as runtime
        data = torch.load({str(tmp_path / 'data.pt')!r})
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        model.load_state_dict(data["state"])
        loaded = runtime.load_compiled_function({str(path)!r})
        out = loaded(model, data["x"])
        torch.testing.assert_close(out, model(data["x"]))
        out.sum().backward()
        assert model[0].weight.grad is not None
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_output_matching_tolerates_16_bit_rounding_but_not_other_values() -> None:
    from kiln.aot import _close

    x = torch.randn(64, 50, dtype=torch.bfloat16) * 30
    rounded = (x.float() + torch.randn(64, 50) * 0.25).to(torch.bfloat16)  # another summation order
    assert _close(x, rounded)
    assert not _close(x, torch.randn(64, 50, dtype=torch.bfloat16) * 30)
    y = torch.randn(8, 8)
    assert _close(y, y.clone()) and not _close(y, y + 1e-2) and not _close(y, y.double())
    logits = torch.randn(4, 1000) * 20  # TF32 convolutions: an error up to ~5e-4 of the largest value
    assert _close(logits, logits + torch.randn(4, 1000).clamp(-3, 3) * 1.5e-4 * logits.abs().max())
    assert not _close(logits, torch.randn(4, 1000) * 20) and not _close(logits, logits * 1.01)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_create_graph_behaves_alike_in_process_and_after_load(backend: str, tmp_path) -> None:
    """One compiled-training autograd.Function: with create_graph=True the compiled program and the
    artifact loaded from it both give eager's first-order gradient, and both raise the same clear
    DoubleBackwardError when that gradient is differentiated again."""
    from kiln.graph import DoubleBackwardError
    from kiln.runtime import load_compiled_function

    def loss(x, w):
        return (x * w).pow(2).sum()

    x0, w0 = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    compiled = kiln.compile(loss, fullgraph=True, backend=backend).aot_compile(((x0, w0), {}))
    compiled.save_compiled_function(tmp_path / "loss.kiln")
    loaded = load_compiled_function(tmp_path / "loss.kiln")
    for fn in (compiled, loaded):
        for _ in range(3):  # fresh inputs each call
            x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
            (g,) = torch.autograd.grad(fn(x, w), w, create_graph=True)
            torch.testing.assert_close(g, 2 * x * x * w.detach())
            assert g.requires_grad
            with pytest.raises(DoubleBackwardError, match="double backward"):
                g.pow(2).sum().backward()
