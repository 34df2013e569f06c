"""torch.library custom ops compile end to end: one node in the captured graph, recorded by the joint
trace with the backward the library registered, run by kiln.inductor as a call of the op."""

from __future__ import annotations

import logging

import torch
from torch import nn

import kiln


@torch.library.custom_op("kiln_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * w


@scaled_sin.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    return grad * torch.cos(x) * w, (grad * torch.sin(x)).sum(0)


scaled_sin.register_autograd(_backward, setup_context=_setup)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.w = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kiln_test.scaled_sin(self.fc(x), self.w).relu() + 1


def test_custom_op_inference_and_training_match_eager(caplog) -> None:
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 6)
    compiled = kiln.compile(model)
    with caplog.at_level(logging.INFO, logger="kiln.graph_breaks"):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        out = compiled(x)
    assert not [r for r in caplog.records if r.name == "kiln.graph_breaks"]
    out.square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad)


@torch.library.custom_op("kiln_test::norm_scale", mutates_args=())
def norm_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@norm_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _norm_scale_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 2 + 0 * float(x.abs().max().item())  # reads a value: untraceable on fake tensors


norm_scale.register_autograd(_norm_scale_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


def test_untraceable_backward_runs_the_graph_with_torch_autograd_and_says_so(caplog) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    compiled = kiln.compile(lambda t: torch.ops.kiln_test.norm_scale(lin(t)).sum())
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"):
        compiled(x).backward()
    assert any("runs op by op with torch's autograd" in r.getMessage() for r in caplog.records)
    got = lin.weight.grad.clone()
    lin.zero_grad()
    torch.ops.kiln_test.norm_scale(lin(x)).sum().backward()
    torch.testing.assert_close(got, lin.weight.grad)
