"""CPU training of a convolution network through kiln.compile: kiln.inductor turns CPU training graphs
channels-last (oneDNN's convolution backward is NHWC). Steps with fresh inputs against an eager copy:
losses, parameter gradients (eager's strides), BatchNorm running statistics and updated weights."""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

import kiln


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.down = nn.Conv2d(16, 32, 3, 2, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(self.down(x).mean((2, 3)))


def test_conv_training_steps_match_eager_with_fresh_inputs(caplog) -> None:
    from kiln.graph import set_logs

    set_logs("perf_hints")
    logging.getLogger("kiln.perf_hints").propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
            _train_steps()
    finally:
        set_logs()
    layouts = [r.getMessage() for r in caplog.records if "conv layout" in r.getMessage()]
    # the forward and the backward graph (unless both came from kiln's compile cache, which logs nothing)
    assert all("channels-last (auto: CPU training" in m for m in layouts), layouts


def _train_steps() -> None:
    torch.manual_seed(0)
    eager = Net().train()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, model)]
    for step, batch in enumerate((4, 4, 3, 5)):  # the third step recompiles with a dynamic batch
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
        losses = []
        for fn, opt in ((eager, opts[0]), (compiled, opts[1])):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(fn(x), y)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5, msg=f"loss, step {step}")
        for (name, pe), pk in zip(eager.named_parameters(), model.parameters()):
            assert pk.grad.stride() == pe.grad.stride(), (name, pk.grad.stride(), pe.grad.stride())
            torch.testing.assert_close(pk.grad, pe.grad, rtol=1e-3, atol=1e-4, msg=f"grad {name}, step {step}")
        for opt in opts:
            opt.step()
        for (name, be), bk in zip(eager.named_buffers(), model.buffers()):
            torch.testing.assert_close(bk, be, rtol=1e-4, atol=1e-5, msg=f"buffer {name}, step {step}")


class ConvReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _sin_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(nn.functional.conv2d(x, w, padding=1))


def test_conv_training_with_dynamic_image_sizes_matches_eager() -> None:
    """Symbolic image sizes: a convolution output's stride holds ``Max(1, H - k + 1 + 2p)``, which kept
    it from counting as dense, so the channels-last rewrite neither restored the user's output to NCHW
    nor the saved activation the backward graph (compiled for NCHW) read: every gradient came out wrong.
    A weight passed as a dynamic input made the layout heuristic format a SymFloat (TypeError)."""
    torch.manual_seed(0)
    eager = ConvReLU().train()
    model = copy.deepcopy(eager)
    cases = ((eager, kiln.compile(model, dynamic=True), None),
             (_sin_conv, kiln.compile(_sin_conv, dynamic=True), torch.randn(4, 3, 3, 3)))
    for fn, compiled, w in cases:
        for shape in ((2, 3, 8, 8), (2, 3, 9, 11), (1, 3, 5, 4)):
            x = torch.randn(shape)
            args = [[x.clone().requires_grad_()] + ([] if w is None else [w.clone().requires_grad_()])
                    for _ in range(2)]
            want, got = fn(*args[0]), compiled(*args[1])
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride(), (got.stride(), want.stride())
            g = torch.randn_like(want)
            want.backward(g)
            got.backward(g)
            for a, b in zip(args[1], args[0]):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=f"input grad, {shape}")
        for (name, pe), pk in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(pk.grad, pe.grad, rtol=1e-4, atol=1e-4, msg=f"grad {name}")
