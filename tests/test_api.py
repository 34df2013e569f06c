"""kiln.compile's user surface, with recording backends (no code generator needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln
from kiln.graph import verify


class Recorder:
    """A backend that records every graph it is given and runs it unchanged."""

    def __init__(self) -> None:
        self.graphs: list = []
        self.__name__ = "recorder"

    def __call__(self, gm, example_inputs):
        verify(gm, "torch")
        self.graphs.append(gm)
        return gm.forward


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_compile_a_function_with_a_callable_backend() -> None:
    rec = Recorder()

    def f(x, y):
        return torch.sin(x) + y * 2

    cf = kiln.compile(f, backend=rec)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(cf(x, y), f(x, y))
    assert len(rec.graphs) == 1
    assert cf.__name__ == "f"


def test_decorator_with_and_without_arguments() -> None:
    @kiln.compile
    def g(x):
        return x.relu()

    rec = Recorder()

    @kiln.compile(backend=rec, fullgraph=True)
    def h(x):
        return x.cos() * 3

    x = torch.randn(5)
    torch.testing.assert_close(h(x), x.cos() * 3)
    assert len(rec.graphs) == 1
    assert callable(g)


def test_compiled_module_keeps_parameters_state_dict_and_modes() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    rec = Recorder()
    cm = kiln.compile(model, backend=rec)
    assert list(cm.parameters()) == list(model.parameters())
    assert set(cm.state_dict()) == {f"_orig_mod.{k}" for k in model.state_dict()}
    cm.eval()
    assert not model.training
    x = torch.randn(3, 4)
    torch.testing.assert_close(cm(x), model(x))
    cm.train()
    assert model.training
    torch.manual_seed(0)
    out = cm(x)
    assert out.shape == (3, 2)
    assert len(rec.graphs) >= 1


def test_compiled_module_runs_forward_hooks() -> None:
    model = nn.Linear(4, 4)
    calls = []
    model.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    model.register_forward_hook(lambda m, args, out: out * 0 + 1)
    cm = kiln.compile(model, backend=Recorder())
    out = cm(torch.randn(2, 4))
    assert calls == ["pre"]
    torch.testing.assert_close(out, torch.ones(2, 4))


def test_training_step_gradients_match_eager_with_graph_backend() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    cm = kiln.compile(model, backend=Recorder())
    x = torch.randn(16, 4)
    cm(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@kiln.disable
def _opaque() -> None:
    """Runs in Python, never captured: calling it is a graph break."""


def test_explain_reports_graphs_and_breaks() -> None:
    def f(x):
        y = x * 2
        _opaque()  # the break
        return y + 1

    report = kiln.explain(f)(torch.randn(3))
    assert report.graph_count == 2
    assert report.break_count == 1
    assert "kiln.disable" in report.as_text()


def test_static_shape_backends_recompile_per_size_instead_of_failing() -> None:
    def f(x):
        return torch.tanh(x) * 2

    cf = kiln.compile(f, backend="aot_eager")
    for n in (3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), f(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_dynamic_true_is_accepted_by_every_backend(backend: str) -> None:
    def f(x):
        return x * 2 + 1
    cf = kiln.compile(f, backend=backend, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), f(x))
    assert len(kiln.capture.cache_entries(cf._optimized)) == 1
