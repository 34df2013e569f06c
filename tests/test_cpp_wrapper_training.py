"""kiln.compile's C++ wrapper for training graphs: the forward's and the backward's libraries, the
backward dropping its saved activations after their last use, CUDA training on the Python, C++ and tiered
wrappers.

Every test trains the compiled program over several steps with fresh inputs and compares outputs,
gradients and buffers with eager, and checks which wrapper ran.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from cpp_wrapper_helpers import CPP, Block, Wrappers, _call_peak, step_as_eager
from torch import nn

import kiln
from kiln.inductor import wait_tiered
from kiln.inductor.tiered import live_tiered

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="the C++ wrapper is built with g++")]


def test_training_graphs_run_through_the_cpp_wrapper() -> None:
    """The forward and the backward of a training graph: C++ wrappers, with gradients, outputs and a
    BatchNorm's running statistics (written in place by the forward) equal eager's over calls with
    fresh inputs."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w:
        for step in range(3):
            step_as_eager(eager, model, compiled, torch.randn(5, 6), step)
            for (name, b), c in zip(eager.named_buffers(), model.buffers()):
                torch.testing.assert_close(c, b, msg=f"step {step}: {name}")
    assert w.graphs == [True]  # one training program: its forward and its backward libraries
    assert w.sources[0].count("_GraphLibrary(") == 2, w.sources[0]


def test_backward_drops_saved_activations_as_it_goes(stage_texts) -> None:
    """A backward's saved activations, handed over by kiln.autograd: the C++ wrapper drops each after its
    last use, so a training step's peak is the Python wrapper's (holding all of them until the backward
    returned, with the weight gradients allocated beside them, it was 19 MB against 12 here; an AMP
    Llama-350M step's 2.5x the Python wrapper's on an H100). Gradients equal eager's over fresh inputs."""
    torch.manual_seed(0)
    eager = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(512, 512), nn.Tanh())])
    peaks = {}
    for wrapper in ("python", "cpp"):
        model = copy.deepcopy(eager)
        compiled = kiln.compile(model, options={"wrapper": wrapper})
        with Wrappers() as w, stage_texts("cpp_wrapper") as texts:
            for step in range(3):
                x = torch.randn(512, 512, requires_grad=True)
                peaks[wrapper], _ = _call_peak(lambda: compiled(x).square().mean().backward())  # noqa: B023
                eager(x).square().mean().backward()
                for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                    torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4 * p.grad.abs().max().item(),
                                               msg=f"{wrapper} step {step}: {name}")
                eager.zero_grad(), model.zero_grad()
        assert w.graphs == [wrapper == "cpp"], w.graphs
        if wrapper == "cpp":  # the forward's inputs are the caller's too (parameters): only the backward drops
            forward, backward = (t.text for t in texts)
            assert "drop_input" not in forward and backward.count("kiln_rt::drop_input(") >= 8, backward
    activation = 512 * 512 * 4
    assert peaks["cpp"] <= peaks["python"] + activation, \
        f"step peak MiB: C++ wrapper {peaks['cpp'] / 2**20:.1f}, Python {peaks['python'] / 2**20:.1f}"


class SavedViews(nn.Module):
    """Saved activations a backward reads in many forms: chunks, a transpose and a narrow (storage offset)
    of one tensor, argmax indices and a bool mask, a causal attention's, a layer norm's statistics."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln, self.qkv, self.fc = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.w = nn.Parameter(torch.randn(d, d) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = torch.tanh(self.ln(x) @ self.w)
        a, g = h.chunk(2, dim=-1)
        q, k, v = (y.view(b, t, 4, d // 4).transpose(1, 2) for y in self.qkv(h).split(d, dim=-1))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        picked = torch.gather(h, -1, h.argmax(-1, keepdim=True))
        gram = a.transpose(1, 2) @ torch.sigmoid(g)
        tail = h.narrow(1, 2, t - 2).square().mean()
        return self.fc(att * (h > 0)) + picked + gram.mean() + tail


def test_backward_reads_no_dropped_activation(stage_texts) -> None:
    """The C++ wrapper drops each saved activation after its last use: none is read after that. glibc fills
    freed memory (M_PERTURB), so a read of a dropped activation's memory would give garbage instead of the
    values it still held (these activations are small: freed, they stay in the heap, unchanged until
    reused). Gradients of the parameters and of the input equal eager's over calls with fresh inputs."""
    import ctypes
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        pytest.skip("glibc's mallopt is needed to fill freed memory")
    torch.manual_seed(0)
    eager = nn.Sequential(*[SavedViews() for _ in range(3)])
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model, options=CPP)
    m_perturb = -6
    mallopt(m_perturb, 0xA5)
    try:
        with Wrappers() as w, stage_texts("cpp_wrapper") as texts:
            for step in range(3):
                x = torch.randn(4, 24, 32)
                xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
                got, want = compiled(xc), eager(xe)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"step {step}: output")
                got.square().mean().backward()
                want.square().mean().backward()
                grads = [("x", xc.grad, xe.grad)] + [(name, q.grad, p.grad) for (name, p), q in
                                                     zip(eager.named_parameters(), model.parameters())]
                for name, g, e in grads:
                    torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4 * e.abs().max().item(),
                                               msg=f"step {step}: {name}")
                eager.zero_grad(), model.zero_grad()
    finally:
        mallopt(m_perturb, 0)
    assert w.graphs == [True], w.graphs
    forward, backward = (t.text for t in texts)
    assert backward.count("kiln_rt::drop_input(") >= 12, backward


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("wrapper", ["python", "cpp", "tiered"])
def test_cuda_amp_training_on_each_wrapper(wrapper: str) -> None:
    """Training steps on the GPU through either wrapper: a conv/BatchNorm block (running statistics written
    over the module's buffers by the forward's kernels) and an attention block under autocast whose bf16
    SDPA runs one of the library's fused kernels (cuDNN's backward takes the forward's undefined
    ``cum_seq_q``/``cum_seq_k``: the C++ wrapper raised "Expected Tensor but got None" on it). Outputs,
    gradients and buffers equal eager's over every step with fresh inputs; tiered (kiln.compile's default
    for CUDA training graphs): through the Python wrapper, the trial alternating both, and the one settled."""
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 1),
                         nn.BatchNorm2d(8)).cuda()
    block = Block(d=256, heads=4).cuda()
    with Wrappers() as w:
        for eager, shape, amp in ((conv, (8, 3, 16, 16), False), (block, (2, 128, 256), True)):
            model = copy.deepcopy(eager)
            before = {id(c) for c in live_tiered()}
            options = {"wrapper": wrapper, **({"tiered_trial_calls": 2} if wrapper == "tiered" else {})}
            compiled = kiln.compile(model, options=options)
            for step in range(10 if wrapper == "tiered" else 4):
                if step == 1 and wrapper == "tiered":
                    assert wait_tiered(600)  # the forward's and backward's C++ wrappers built
                x = torch.randn(shape, device="cuda")
                with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                    want, got = eager(x).float(), compiled(x).float()
                scale = want.abs().max().item()
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * scale, msg=f"step {step}")
                r = torch.randn_like(want)  # a loss BatchNorm's output does not make constant
                (want * r).mean().backward()
                (got * r).mean().backward()
                # at the largest gradient's scale: a bias before a BatchNorm has a gradient of rounding noise
                tol = 3e-2 * max(p.grad.abs().max().item() for p in eager.parameters())
                for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                    torch.testing.assert_close(q.grad, p.grad, rtol=3e-2, atol=tol, msg=f"step {step}: {name}")
                eager.zero_grad(), model.zero_grad()
                for (name, b), c in zip(eager.named_buffers(), model.buffers()):
                    torch.testing.assert_close(c.float(), b.float(), rtol=1e-2, atol=1e-3, msg=f"step {step}: {name}")
            if wrapper == "tiered":  # both graphs of each model past their trial, on either wrapper
                tiers = [c.tier for c in live_tiered() if id(c) not in before]
                assert len(tiers) == 2 and all(t in ("cpp", "python") for t in tiers), tiers
    assert w.graphs == [wrapper == "cpp"] * 2, w.graphs
