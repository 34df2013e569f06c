"""Common ways programs turn a varying size into a number, through kiln.compile's automatic dynamic
shapes and the inductor backend (C++, and Triton under TRITON_INTERPRET=1): ``torch.linspace(0, 1, n)``,
``F.scaled_dot_product_attention(..., scale=1 / math.sqrt(d))``, ``torch.arange(n) / n``,
``x.new_full((n,), 1.0 / n)``, ``torch.linspace(0, n, steps=n)``, ``x * math.sqrt(d)``. Called with many
sizes: the first compile is static, the second symbolic and serves every later size (no recompile
per size, no graph left to ATen), and every call equals eager with fresh inputs."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

import kiln

torch.manual_seed(0)

CPP = pytest.param({}, id="cpp")
TRITON = pytest.param({"cpu_backend": "triton"}, id="triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1"))

SIZES = (4, 7, 9, 12, 33, 17, 64)

PATTERNS = {
    "linspace": (lambda x: x * torch.linspace(0, 1, x.shape[0]), lambda n: torch.randn(n)),
    "linspace_to_n": (lambda x: x + torch.linspace(0, x.shape[0], steps=x.shape[0]), lambda n: torch.randn(n)),
    "linspace_float64": (lambda x: x + torch.linspace(-2.5, 3.0, x.shape[-1], dtype=torch.float64),
                         lambda n: torch.randn(3, n, dtype=torch.float64)),
    "sdpa_scale_head_dim": (lambda q: F.scaled_dot_product_attention(q, q * 2, q + 1, scale=1 / math.sqrt(q.shape[-1])),
                            lambda n: torch.randn(2, 3, 5, n)),
    "sdpa_scale_seq_len": (lambda q: F.scaled_dot_product_attention(q, q.flip(2), q + 1, is_causal=True,
                                                                     scale=0.5 / math.sqrt(q.shape[-2])),
                           lambda n: torch.randn(2, 3, n, 8)),
    "arange_over_n": (lambda x: x + torch.arange(x.shape[0]) / x.shape[0], lambda n: torch.randn(n)),
    "new_full_inverse": (lambda x: x + x.new_full((x.shape[0],), 1.0 / x.shape[0]), lambda n: torch.randn(n)),
    "times_sqrt_of_size": (lambda x: x * math.sqrt(x.shape[-1]), lambda n: torch.randn(3, n)),
    "slice_to_ceil": (lambda x: x[: math.ceil(x.shape[0] / 3)] * 2, lambda n: torch.randn(n)),
    "slice_to_int_of_float": (lambda x: x[: int(x.shape[0] * 0.5)] * 2, lambda n: torch.randn(n)),
    # (8 - n % 8) % 8 once became (-(n % 8)) % 8 in the kernels, negative in C: every size not a multiple
    # of 8 read the padded rows from the wrong place, silently
    "pad_to_multiple_of_8": (lambda x: F.pad(x, (0, (8 - x.shape[-1] % 8) % 8)) * 2, lambda n: torch.randn(3, n)),
    "pad_to_multiple_then_sum": (lambda x: F.pad(x, (0, (8 - x.shape[-1] % 8) % 8)).sum(-1, keepdim=True) + x[:, :1],
                                 lambda n: torch.randn(3, n)),
}


@pytest.mark.parametrize("options", [CPP, TRITON])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_size_pattern_compiles_at_most_twice(name, options, stage_texts):
    fn, make = PATTERNS[name]
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(fn, options=options)
    with stage_texts("output_code") as ids:
        for n in SIZES:
            x = make(n)
            torch.testing.assert_close(cf(x), fn(x), atol=1e-5, rtol=1e-5, msg=lambda m, n=n: f"size {n}: {m}")
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and s.recompiles <= 1, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s
    assert len(ids) + s.cache_hits >= s.graphs_compiled  # kiln.inductor generated (or cached) each graph


def test_attention_with_a_symbolic_scale_trains():
    """The scaled query's gradient flows through the symbolic scale: gradients equal eager's for every
    head size, one symbolic graph for the forward and the backward."""
    kiln.reset()
    kiln.stats_reset()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(q.shape[-1])).square().sum()
    cf = kiln.compile(f)
    for d in (4, 8, 6, 16, 5):
        q, k, v = (torch.randn(2, 2, 7, d, requires_grad=True) for _ in range(3))
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        got, want = cf(q, k, v), f(q2, k2, v2)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        for a, b in ((q, q2), (k, k2), (v, v2)):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda m, d=d: f"head {d}: {m}")
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


def _tail_of_six(x):
    return x[x.shape[0] - 6:] * 2 + x[x.shape[0] - 6: x.shape[0] - 2].sum()


def _zero_tail_of_six(x):
    y = x.clone()
    y[y.shape[0] - 6:] = 0
    return y


def _scatter_two(x):
    return torch.slice_scatter(x, torch.zeros(2), 0, x.shape[0] - 6, x.shape[0] - 4)


@pytest.mark.parametrize("fn", [_tail_of_six, _zero_tail_of_six, _scatter_two])
def test_slice_start_from_a_size_expression_that_goes_negative(fn) -> None:
    """``x[n - 6:]``: for n < 6 the start counts from the end (and clamps to 0 below -n), as eager
    says; the lowering took the symbolic start as an offset from the front (read before the tensor).
    slice_scatter's start is not guarded by the trace: its sign is a size guard of the compile."""
    g = kiln.compile(fn, dynamic=True)
    for n in (8, 9, 10, 4, 3, 5, 7, 12, 2, 6):
        x = torch.randn(n)
        try:
            want = fn(x)
        except RuntimeError:  # slice_scatter's two elements do not fit the slice at this size
            continue
        torch.testing.assert_close(g(x), want)


def test_backward_of_a_chunk_reads_the_whole_size():
    """``x.chunk(3)[0]`` trained: the cut saved the chunk (``(n + 2) // 3`` rows) and that size itself,
    but the backward's buffers are written in ``n``, which no input of the backward was: its kernels
    raised NameError. The forward now also returns ``n`` for it. Fresh inputs, sizes changing, the
    gradients equal eager's."""
    kiln.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    eager = torch.nn.Linear(6, 3)
    eager.load_state_dict(model.state_dict())

    def step(m, x, y):
        loss = F.mse_loss(m(x.chunk(3)[0]), y.chunk(3)[0])
        loss.backward()
        return loss.detach()
    cf = kiln.compile(step)
    for n in (8, 6, 9, 7, 12, 10):
        x, y = torch.randn(n, 6), torch.randn(n, 3)
        torch.testing.assert_close(cf(model, x, y), step(eager, x, y))
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=n: f"size {n}: {m}")
            p.grad = q.grad = None
