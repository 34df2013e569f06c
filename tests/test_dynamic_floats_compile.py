"""kiln.compile (inductor) on a stream of Python floats: a float argument that changes between calls (a
learning rate, a scale, a clamp bound, an exponent, a fill value, a ``.item()`` read after a graph break)
is a symbolic graph input that kiln.inductor compiles as a float kernel argument: at most two compiles
(the first call's constant, then the symbolic one), no graph left to ATen, and every call equals eager
with fresh inputs and values -- on the C++ kernels (Python and C++ wrappers) and Triton (interpreter)."""

from __future__ import annotations

import copy
import logging
import math
import os

import pytest
import torch
from torch.optim.sgd import sgd

import kiln

CPP = pytest.param({}, id="cpp")
CPP_WRAPPER = pytest.param({"wrapper": "cpp"}, id="cpp_wrapper")
TRITON = pytest.param({"cpu_backend": "triton"}, id="triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1"))

VALUES = (0.25, 1 / 3, 0.7, 1.5, -0.375, 2.0 / 7, 3.25, 1e-3)

PATTERNS = {
    "scale": lambda x, f: x * f - f,
    "clamp_min": lambda x, f: torch.clamp(x, min=f),
    "pow": lambda x, f: x.abs().pow(f),
    "full": lambda x, f: torch.full((x.shape[-1],), f) + x,
    "float_math": lambda x, f: x / (f * f + 1.0) + (1.0 - f) * 0.5,
}


def item_then_print(x):
    s = x.sum().item()
    print("", end="")
    return x * s + torch.tanh(x) / (s * s + 1.0)


def step(x, lr: float):
    return x - lr * x.cos()


def _wrapper_hints(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Python wrapper" in r.getMessage()
            or "op by op" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("options", [CPP, CPP_WRAPPER, TRITON])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_float_argument_compiles_once_for_every_value(name, options, caplog):
    fn = PATTERNS[name]
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(fn, options=options)
    caplog.set_level(logging.WARNING, logger="kiln.perf_hints")
    with torch.no_grad():  # wrapper='cpp' serves inference graphs
        for k, f in enumerate(VALUES):
            x = torch.randn(3, 5, dtype=torch.bfloat16 if k == len(VALUES) - 1 else torch.float32)
            # bfloat16: the fused kernel rounds once where eager rounds after every op (one bf16 ulp apart)
            tol = {"rtol": 1.6e-2, "atol": 1e-2} if x.dtype == torch.bfloat16 else {}
            torch.testing.assert_close(cf(x, f), fn(x, f), **tol, msg=lambda m, f=f: f"value {f}: {m}")
    s = kiln.stats()
    # the first value's constant, the symbolic float, and the bfloat16 input (a dtype recompile)
    assert s.graphs_compiled <= 3 and s.recompiles <= 2, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s
    assert _wrapper_hints(caplog) == []  # wrapper='cpp' kept its C++ wrapper, nothing ran op by op


@pytest.mark.slow
@pytest.mark.parametrize("options", [CPP, TRITON])
def test_learning_rate_argument_trains(options):
    """The forward and the backward both read lr (the backward saves it as a scalar)."""
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(step, options=options)
    for i in range(8):
        x = torch.randn(5, 3, requires_grad=True)
        lr = 0.01 * (i + 1) + 1 / 3
        torch.testing.assert_close(g(x, lr), step(x, lr))
        got = torch.autograd.grad(g(x, lr).sum(), x)[0]
        torch.testing.assert_close(got, torch.autograd.grad(step(x, lr).sum(), x)[0])
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


@pytest.mark.slow
def test_float_streams_compile_at_most_twice() -> None:
    kiln.reset()
    kiln.stats_reset()  # the counters are process-wide: other tests in this worker counted before
    f, g = kiln.compile(item_then_print), kiln.compile(step)
    for i in range(10):
        x = torch.randn(5, 3, requires_grad=True)
        torch.testing.assert_close(f(x), item_then_print(x))
        lr = 0.01 * (i + 1)
        torch.testing.assert_close(g(x, lr), step(x, lr))
        got = torch.autograd.grad(g(x, lr).sum(), x)[0]
        torch.testing.assert_close(got, torch.autograd.grad(step(x, lr).sum(), x)[0])
    # item_then_print: its graph, then the resume function twice; step: twice
    s = kiln.stats()
    assert s.graphs_captured <= 5, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s  # compiled, not run through ATen


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


@pytest.mark.slow
@pytest.mark.parametrize("options", [CPP, TRITON])
def test_sgd_step_with_a_scheduled_learning_rate(options):
    """torch.optim.SGD (momentum, weight decay) driven by StepLR; the compiled step is torch's own
    single-tensor SGD update fed the scheduler's lr each call: parameters equal eager's after every step."""
    torch.manual_seed(0)
    model = _model()
    ref = copy.deepcopy(model)
    params = [p.detach() for p in model.parameters()]  # updated in place, as the optimizer does under no_grad
    bufs = [torch.zeros_like(p) for p in params]

    def update(grads, lr: float):
        sgd(params, grads, bufs, weight_decay=0.01, momentum=0.9, lr=lr, dampening=0.0, nesterov=False,
            maximize=False, foreach=False)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False)
    schedule = torch.optim.lr_scheduler.StepLR(ropt, step_size=1, gamma=0.7)
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(update, options=options)
    for i in range(8):
        x = torch.randn(4, 6)
        for m in (model, ref):
            m.zero_grad()
            m(x).square().mean().backward()
        with torch.no_grad():
            compiled([p.grad for p in model.parameters()], ropt.param_groups[0]["lr"])
        ropt.step()
        schedule.step()
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, msg=lambda m, i=i: f"step {i}: {m}")
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


def adamw_update(params, grads, exp_avgs, exp_avg_sqs, lr: float, bias1: float, bias2_sqrt: float,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01):
    """AdamW's update (torch.optim.AdamW's single-tensor algorithm) with the step's floats as arguments."""
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        p.mul_(1 - lr * weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bias2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-(lr / bias1))


@pytest.mark.slow
@pytest.mark.parametrize("options", [CPP, TRITON])
def test_adamw_step_with_a_scheduled_learning_rate(options):
    """AdamW with a cosine schedule: the learning rate and both bias corrections change every step (three
    float arguments); one symbolic compile serves every step and the parameters follow torch.optim.AdamW."""
    torch.manual_seed(0)
    model = _model()
    ref = copy.deepcopy(model)
    params = [p.detach() for p in model.parameters()]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.01, foreach=False)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(ropt, T_max=10)
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(adamw_update, options=options)
    for i in range(8):
        x = torch.randn(4, 6)
        for m in (model, ref):
            m.zero_grad()
            m(x).square().mean().backward()
        n = i + 1
        lr = ropt.param_groups[0]["lr"]
        with torch.no_grad():
            compiled(params, [p.grad for p in model.parameters()], exp_avgs, exp_avg_sqs, lr,
                     1 - 0.9 ** n, math.sqrt(1 - 0.999 ** n))
        ropt.step()
        schedule.step()
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, msg=lambda m, i=i: f"step {i}: {m}")
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("options", [pytest.param({}, id="python_wrapper"),
                                     pytest.param({"wrapper": "cpp"}, id="cpp_wrapper")])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_float_argument_on_the_gpu(name, options, caplog):
    """The same float streams on CUDA tensors: real Triton kernels with an fp64 scalar argument."""
    fn = PATTERNS[name]
    kiln.reset()
    kiln.stats_reset()
    cf = kiln.compile(fn, options=options)
    caplog.set_level(logging.WARNING, logger="kiln.perf_hints")
    with torch.device("cuda"), torch.no_grad():
        for f in VALUES:
            x = torch.randn(3, 5)
            torch.testing.assert_close(cf(x, f), fn(x, f), msg=lambda m, f=f: f"value {f}: {m}")
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and s.recompiles <= 1, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s
    print(name, options, "hints:", _wrapper_hints(caplog))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learning_rate_argument_trains_on_the_gpu():
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(step)
    for i in range(8):
        x = torch.randn(5, 3, device="cuda", requires_grad=True)
        lr = 0.01 * (i + 1) + 1 / 3
        torch.testing.assert_close(g(x, lr), step(x, lr))
        got = torch.autograd.grad(g(x, lr).sum(), x)[0]
        torch.testing.assert_close(got, torch.autograd.grad(step(x, lr).sum(), x)[0])
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


def _roll_by_float(x, f):
    return x.roll(int(f), 0) * f + torch.arange(x.shape[0]) % max(int(f), 1)


@pytest.mark.parametrize("options", [CPP, CPP_WRAPPER])
def test_size_rounded_from_a_negative_float(options) -> None:
    """``int(f)`` of a float argument is a derived size, but not a non-negative one: ``f`` may be -1.5.
    ``x.roll(int(f))``'s ``int(f) % n`` was taken as non-negative and compiled as C's ``%``, which
    rounds a negative dividend the other way: negative shifts rolled the wrong elements."""
    g = kiln.compile(_roll_by_float, options=options)
    for f in (2.5, 3.5, -1.5, -2.5, 4.5, -7.25):
        x = torch.randn(5)
        torch.testing.assert_close(g(x, f), _roll_by_float(x, f))


def _slice_from_float(x, f):
    return x[int(f):] * 2 + x.view(2, -1)[:, int(f):].sum()


@pytest.mark.parametrize("options", [CPP, CPP_WRAPPER])
def test_slice_from_a_negative_rounded_float(options) -> None:
    """``x[int(f):]`` with ``f = -1.5`` counts from the end (the trace guards the sign); the lowering
    took the symbolic start as an offset from the front and read before the tensor's first element."""
    g = kiln.compile(_slice_from_float, options=options)
    for f in (2.5, 3.5, -1.5, -2.5, 1.2, -3.5):
        x = torch.randn(8)
        torch.testing.assert_close(g(x, f), _slice_from_float(x, f))
