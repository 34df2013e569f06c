"""Dynamic shapes end to end through aot_eager: one compile serves every size (0 and 1 specialise, as
in torch), forward and backward equal eager's for each size, called repeatedly with fresh inputs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
import kiln.capture as kc

torch.manual_seed(0)


def _entries(cf: Any) -> int:
    opt = cf._compiled_forward if isinstance(cf, kiln.api.OptimizedModule) else cf._optimized
    return len(kc.cache_entries(opt))


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


def _run(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs, then the gradients of every input that requires grad (a fixed random loss)."""
    outs = _leaves(fn(*args))
    diff = [o for o in outs if o.requires_grad]
    if diff:
        g = torch.Generator().manual_seed(7)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in diff)
        loss.backward()
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return [o.detach() for o in outs], [a.grad for a in leaves]


def _fresh(make: Callable[[int], Sequence[Any]], n: int) -> tuple[list[Any], list[Any]]:
    torch.manual_seed(1000 + n)
    a = list(make(n))
    b = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) and x.is_leaf
         else x for x in a]
    return a, b


def check_sizes(fn: Callable[..., Any], make: Callable[[int], Sequence[Any]], sizes: Sequence[int],
                *, module: nn.Module | None = None, rtol: float = 1e-4, atol: float = 1e-5,
                one_shares: bool = True) -> Any:
    """``fn`` compiled with aot_eager + dynamic=True over ``sizes`` (each twice, fresh inputs), compared
    with eager; returns the compiled callable. Asserts one entry for every size >= 1 (and one for 0)."""
    cf = kiln.compile(module if module is not None else fn, backend="aot_eager", dynamic=True)
    for n in [*sizes, *sizes]:
        eager_args, compiled_args = _fresh(make, n)
        if module is not None:
            module.zero_grad(set_to_none=True)
        e_out, e_grads = _run(fn, eager_args)
        e_params = [p.grad.clone() if p.grad is not None else None for p in (module.parameters() if module else [])]
        if module is not None:
            module.zero_grad(set_to_none=True)
        c_out, c_grads = _run(cf, compiled_args)
        for a, b in zip(c_out, e_out, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=n: f"size {n}: output {m}")
        for a, b in zip(c_grads, e_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=n: f"size {n}: input grad {m}")
        for p, e in zip(module.parameters() if module else [], e_params):
            torch.testing.assert_close(p.grad, e, rtol=rtol, atol=atol, msg=lambda m, n=n: f"size {n}: param grad {m}")
    # size 0 compiles its own graph; size 1 (in the symbolic range [1, inf)) shares the symbolic one
    # unless the program decides something on it (``one_shares=False``: a guard the call fails)
    special = (0 in sizes) + (1 in sizes and not one_shares)
    assert _entries(cf) == 1 + special, f"{_entries(cf)} compiles for sizes {sorted(set(sizes))}"
    return cf


SIZES = (2, 3, 7, 16, 1, 0)  # primes, a power of two, and the two sizes torch specialises


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 32), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def test_mlp_over_batch_sizes() -> None:
    m = MLP()
    check_sizes(m, lambda n: [torch.randn(n, 12, requires_grad=True)], SIZES, module=m)


class Attention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return x + self.proj(y)


def test_attention_block_over_sequence_lengths() -> None:
    m = Attention()
    check_sizes(m, lambda n: [torch.randn(2, n, 16, requires_grad=True)], (3, 5, 11, 8), module=m)


def test_sdpa_over_batch_and_sequence() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # captured at n=3 (all dims distinct: dynamic=True duck-sizes equal ones into one symbol)
    check_sizes(f, lambda n: [torch.randn(n, 2, n + 3, 8, requires_grad=True) for _ in range(3)], (3, 5, 2))


@pytest.mark.parametrize("norm", ["layer", "batch", "group", "rms"])
def test_norms(norm: str) -> None:
    mods = {"layer": nn.LayerNorm(6), "batch": nn.BatchNorm1d(6), "group": nn.GroupNorm(2, 6)}
    if norm == "rms":
        w = torch.randn(6, requires_grad=True)

        def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        check_sizes(f, lambda n: [torch.randn(n, 5, 6, requires_grad=True), w.detach().clone().requires_grad_()],
                    (2, 3, 13))
        return
    m = mods[norm]
    make = (lambda n: [torch.randn(n, 6, 5, requires_grad=True)]) if norm != "layer" else \
        (lambda n: [torch.randn(n, 5, 6, requires_grad=True)])
    check_sizes(m, make, (2, 3, 13), module=m)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse", "nll", "bce"])
def test_losses(loss: str) -> None:
    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if loss == "cross_entropy":
            return F.cross_entropy(x, t)
        if loss == "nll":
            return F.nll_loss(x.log_softmax(-1), t)
        if loss == "bce":
            return F.binary_cross_entropy_with_logits(x, t)
        return F.mse_loss(x, t)

    def make(n: int) -> list[torch.Tensor]:
        x = torch.randn(n, 7, requires_grad=True)
        if loss in ("cross_entropy", "nll"):
            return [x, torch.randint(0, 7, (n,))]
        return [x, torch.rand(n, 7)]
    check_sizes(f, make, (2, 5, 17))


def test_views_and_reshapes() -> None:
    def f(x: torch.Tensor) -> Any:
        n = x.shape[0]
        a = x.reshape(-1)
        b = x.view(n, 3, 2).sum(1)
        c = x.t().contiguous().flatten()
        d = x[:, 1:].unflatten(1, (1, -1))
        e = torch.cat([x, x * 2], 0)[n:]
        f_ = x.unsqueeze(0).expand(3, n, 6).mean(0)
        return a * 2, b, c, d + 1, e, f_, x.narrow(0, 0, n - 1) if n > 1 else x
    # ``n > 1`` branches on size 1: a guard, and size 1 compiles its own graph
    check_sizes(f, lambda n: [torch.randn(n, 6, requires_grad=True)], SIZES, one_shares=False)


def test_non_contiguous_inputs() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).softmax(-1) * x.sum(-1, keepdim=True)
    check_sizes(f, lambda n: [torch.randn(8, n).t().requires_grad_(), torch.randn(8, 8, requires_grad=True)],
                (2, 3, 7))


def test_symbolic_int_argument() -> None:
    def f(x: torch.Tensor, k: int) -> torch.Tensor:
        return x[:k] * k
    cf = kiln.compile(f, backend="aot_eager")
    for k in (2, 3, 5, 7, 9, 3):
        x = torch.randn(10, 4, requires_grad=True)
        torch.testing.assert_close(cf(x, k), f(x, k))
    assert _entries(cf) == 2  # k=2 specialised, then one symbolic graph for every k


def test_automatic_dynamic_one_recompile_for_a_size_stream() -> None:
    m = MLP()
    cf = kiln.compile(m, backend="aot_eager")  # dynamic=None: the second size makes the dim symbolic
    for n in range(2, 22):
        x = torch.randn(n, 12)
        torch.testing.assert_close(cf(x), m(x))
    assert _entries(cf) == 2


def test_mark_dynamic_range_and_mark_static() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.relu() + 1
    cf = kiln.compile(f, backend="aot_eager")
    x = torch.randn(4, 3)
    kiln.mark_dynamic(x, 0, min=2, max=8)
    cf(x)
    for n in (2, 5, 8):
        y = torch.randn(n, 3)
        torch.testing.assert_close(cf(y), f(y))
    assert _entries(cf) == 1
    guards = kc.cache_entries(cf._optimized)[0].guards.as_text()
    assert "<= 8" in guards and ">= 2" in guards
    cf(torch.randn(9, 3))  # outside the range: a new entry, never the bounded one
    assert _entries(cf) == 2
    s = torch.randn(4, 3)
    kiln.mark_static(s, 0)
    cs = kiln.compile(f, backend="aot_eager", dynamic=True)
    cs(s)
    assert "(4, None)" in kc.cache_entries(cs._optimized)[0].guards.as_text()


def test_backend_assumptions_are_guarded() -> None:
    """A size assumption made while tracing the ATen graph (reshape into rows of 4) is a guard: a size
    breaking it recompiles instead of running the graph built for it."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4).sum(1)
    cf = kiln.compile(f, backend="aot_eager", dynamic=True)
    for n in (8, 12, 16, 6 * 4):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x), f(x))
    assert _entries(cf) == 1
    text = kc.cache_entries(cf._optimized)[0].guards.as_text()
    assert "% 4) == 0" in text
    with pytest.raises(RuntimeError):
        f(torch.randn(6))
    with pytest.raises(RuntimeError):
        cf(torch.randn(6))  # recompiled for 6, which eager refuses too


def test_inductor_compiles_one_symbolic_graph_for_every_size() -> None:
    """kiln.inductor compiles the symbolic forward and backward: one entry serves every size, with
    generated kernels (not the ATen fallback), and nothing ran eagerly."""
    m = MLP()
    kiln.stats_reset()
    cf = kiln.compile(m, backend="inductor", dynamic=True)
    for n in (3, 8, 13, 5):
        x = torch.randn(n, 12, requires_grad=True)
        out = cf(x)
        torch.testing.assert_close(out, m(x))
        g, = torch.autograd.grad(out.sum(), x)
        e, = torch.autograd.grad(m(x).sum(), x)
        torch.testing.assert_close(g, e)
    assert _entries(cf) == 1
    s = kiln.stats()
    assert (s.graphs_run_eagerly, s.frames_run_eagerly, s.recompiles) == (0, 0, 0)


def test_explain_shows_symbolic_guards_of_a_dynamic_compile() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4).sum(1)
    text = kiln.explain(kiln.compile(f, backend="aot_eager", dynamic=True))(torch.randn(8)).as_text()
    assert "SYMBOL" in text and ":= L['x'].size()[0]" in text and "% 4) == 0" in text


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_pad_to_a_multiple_of_a_symbolic_size(backend: str) -> None:
    """``F.pad`` by ``(-n) % 8`` (HF's attention masks pad so): capture traces it through the Python
    dispatcher, and kiln.inductor, whose C remainder would round ``(-n) % 8`` wrongly, refuses the graph
    (its ATen graph runs instead, counted) rather than compute a wrong pad. One compile serves every size."""
    def f(x):
        pad = (-x.shape[1]) % 8
        return F.pad(x, (0, pad)).softmax(-1) * 2

    kiln.stats_reset()
    cf = kiln.compile(f, dynamic=True, backend=backend)
    for n in (5, 9, 13, 16, 7):
        x = torch.randn(3, n)
        torch.testing.assert_close(cf(x), f(x))
    s = kiln.stats()
    assert (s.graphs_compiled, s.frames_run_eagerly) == (1, 0)
    assert s.graphs_run_eagerly == (1 if backend == "inductor" else 0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_linear_without_bias_stays_symbolic_in_training(backend: str) -> None:
    """``F.linear(x, w)`` of a 3-D input (every Llama projection): torch 2.11's C++ matmul reads the
    input's sizes as ints, which on fake tensors pinned batch and sequence (a guard ``s0 == 3`` per
    size, 8 compiles, then eager). Capture, autograd and decomp trace symbolic sizes through the Python
    dispatcher, so one compile serves every size, forward and backward, called with fresh inputs."""
    w = torch.randn(12, 8, requires_grad=True)

    def f(x, w):
        return F.linear(torch.tanh(x), w).relu().sum(-1)

    kiln.stats_reset()
    cf = kiln.compile(f, dynamic=True, backend=backend)
    for b, t in ((2, 5), (3, 9), (4, 7), (2, 13)):
        x = torch.randn(b, t, 8, requires_grad=True)
        got = cf(x, w)
        want = f(x, w)
        torch.testing.assert_close(got, want)
        gx, gw = torch.autograd.grad(got.sum(), (x, w))
        ex, ew = torch.autograd.grad(want.sum(), (x, w))
        torch.testing.assert_close(gx, ex)
        torch.testing.assert_close(gw, ew)
    s = kiln.stats()
    assert (s.graphs_compiled, s.frames_run_eagerly, s.graphs_run_eagerly) == (1, 0, 0), s


def test_size_saved_for_backward_with_backward_inside_the_step() -> None:
    """``(linear(x) ** 2).mean()`` over a symbolic batch saves ``8 * s0`` (a size expression) for the
    backward; the forward's last lowered node is that ``operator.mul``, and a kernel realized for an
    output once took its name ("k2_operator.mul": a C++ build error). Gradients equal eager's."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = (lin(x) ** 2).mean()
        loss.backward()
        return loss

    compiled = kiln.compile(step, dynamic=True)
    for n in (4, 6, 9, 2):
        x = torch.randn(n, 8)
        lin.zero_grad()
        got = compiled(x)
        got_grads = [p.grad.clone() for p in lin.parameters()]
        lin.zero_grad()
        want = step(x)
        torch.testing.assert_close(got, want)
        for g, p in zip(got_grads, lin.parameters()):
            torch.testing.assert_close(g, p.grad)
