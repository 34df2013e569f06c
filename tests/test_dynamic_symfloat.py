"""Floats computed from dynamic sizes through kiln.compile(dynamic=True) with the inductor backend:
``loss / batch``, ``x * (1.0 / n)``, ``x / math.sqrt(d)``, ``torch.full((n,), 1.0 / n)``, interpolation
scales and sizes floored from them. One compiled graph serves sizes 2, 7, 64 (size 1 specialises, as in torch), kiln.inductor
generates its code (no graph refused to ATen: ``kiln.stats().graphs_run_eagerly``), and results and
gradients equal eager's, called repeatedly with fresh inputs."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

torch.manual_seed(0)

PATTERNS: dict[str, tuple[Callable, Callable[[int], torch.Tensor]]] = {
    "sum_over_batch": (lambda x: x.sum() / x.shape[0], lambda n: torch.randn(n, 5)),
    "loss_times_inverse": (lambda x: (x * x).sum() * (1.0 / x.shape[0]), lambda n: torch.randn(n, 5)),
    "divide_by_sqrt": (lambda x: x / math.sqrt(x.shape[-1]), lambda n: torch.randn(3, n)),
    "full_of_inverse": (lambda x: x + torch.full((x.shape[0],), 1.0 / x.shape[0], device=x.device).unsqueeze(-1),
                        lambda n: torch.randn(n, 5)),
    "mean_over_batch": (lambda x: x.mean(0) + x.sum(0) * (1.0 / float(x.shape[0])), lambda n: torch.randn(n, 5)),
    "interpolate_scale": (lambda x: F.interpolate(x, scale_factor=2.0, mode="linear"),
                          lambda n: torch.randn(2, 3, n)),
    "interpolate_size": (lambda x: F.interpolate(x, size=(2 * x.shape[-1] + 1,), mode="nearest"),
                         lambda n: torch.randn(2, 3, n)),
    "interpolate_by_1_5": (lambda x: F.interpolate(x, scale_factor=1.5, mode="linear"),
                           lambda n: torch.randn(2, 3, n)),
    "softmax_temperature": (lambda x: (x * math.sqrt(x.shape[-1])).softmax(-1), lambda n: torch.randn(3, n)),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_float_from_a_dynamic_size_compiles_once(name: str, stage_texts) -> None:
    fn, make = PATTERNS[name]
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(fn, dynamic=True)
    with stage_texts("output_code") as ids:
        for n in (7, 2, 64, 7, 2, 64):
            x = make(n)
            torch.testing.assert_close(cf(x), fn(x), atol=1e-6, rtol=1e-5, msg=lambda m, n=n: f"size {n}: {m}")
    s = kiln.stats()
    assert (s.graphs_compiled, s.recompiles, s.graphs_run_eagerly, s.frames_run_eagerly) == (1, 0, 0, 0), s
    assert len(ids) == 1 or s.cache_hits == 1  # a graph another test compiled loads from the compile cache
    x = make(1)  # torch specialises size 1: a second entry, compiled too
    torch.testing.assert_close(cf(x), fn(x), atol=1e-6, rtol=1e-5)
    assert kiln.stats().graphs_run_eagerly == 0


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.tanh(self.fc1(x)))
        batch = x.shape[0]
        mse = ((h - y) ** 2).sum() / batch
        return mse + 0.1 * ((h * h).sum() * (1.0 / batch) + h.sum() / math.sqrt(batch))


def test_dynamic_batch_training_step_divides_by_the_batch(stage_texts) -> None:
    """Forward and backward (which recomputes ``1.0 / batch`` and ``sqrt(batch)`` from the saved sizes)
    are one generated graph each for every batch size; gradients and SGD steps equal eager's."""
    torch.manual_seed(1)
    model, ref = Regressor(), Regressor()
    ref.load_state_dict(model.state_dict())
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref))
    kiln.reset()
    kiln.stats_reset()
    step = kiln.compile(model, dynamic=True)
    with stage_texts("output_code") as ids:
        for n in (7, 3, 64, 5, 7, 33):
            x, y = torch.randn(n, 8), torch.randn(n, 4)
            for m, o, run in ((model, opt, step), (ref, ref_opt, ref)):
                o.zero_grad(set_to_none=True)
                loss = run(x, y)
                loss.backward()
                if m is model:
                    got = loss.detach()
                else:
                    torch.testing.assert_close(got, loss.detach(), msg=lambda s, n=n: f"batch {n}: {s}")
            for p, q in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=lambda s, n=n: f"batch {n}: {s}")
            opt.step()
            ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    s = kiln.stats()
    assert (s.graphs_compiled, s.recompiles, s.graphs_run_eagerly, s.frames_run_eagerly) == (1, 0, 0, 0), s
    assert len(ids) == 2 or s.cache_hits == 1, [t.graph_id for t in ids]  # the forward and the backward, generated once


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_float_from_a_dynamic_size_on_the_gpu(name: str) -> None:
    """The same patterns as Triton kernels on CUDA tensors: the float64 scalar math runs on the GPU."""
    fn, make = PATTERNS[name]
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(fn, dynamic=True)
    for n in (7, 2, 64, 129, 7):
        x = make(n).cuda()
        torch.testing.assert_close(cf(x), fn(x), atol=1e-5, rtol=1e-5, msg=lambda m, n=n: f"size {n}: {m}")
    s = kiln.stats()
    assert (s.graphs_compiled, s.recompiles, s.graphs_run_eagerly, s.frames_run_eagerly) == (1, 0, 0, 0), s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dynamic_batch_training_step_on_the_gpu() -> None:
    torch.manual_seed(1)
    model, ref = Regressor().cuda(), Regressor().cuda()
    ref.load_state_dict(model.state_dict())
    kiln.reset()
    kiln.stats_reset()
    step = kiln.compile(model, dynamic=True)
    for n in (7, 3, 64, 5, 257):
        x, y = torch.randn(n, 8, device="cuda"), torch.randn(n, 4, device="cuda")
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        loss, want = step(x, y), ref(x, y)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    s = kiln.stats()
    assert (s.graphs_compiled, s.recompiles, s.graphs_run_eagerly, s.frames_run_eagerly) == (1, 0, 0, 0), s
