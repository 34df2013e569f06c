"""Random ops whose result nothing reads still run: they advance torch's generator, and eager's later
draws depend on where they left it. ``torch.empty(8).uniform_().fill_(0)`` gives zeros either way, but
the next ``torch.rand`` after the compiled call must equal eager's next draw. Kept by kiln.inductor's
dead-code elimination (scheduler/dependencies.py ``runs_for_effect``) and by kiln.autograd's partitioner
(the forward runs them); the cse passes never merge them. These ops run through ATen in program order
(kiln.inductor lowers only rand/randn/bernoulli/dropout to its own counter-based generator, whose one
seed per call is drawn whether or not its draws are read).

Inference and training, the C++ kernels, the C++ wrapper and the Triton kernels (TRITON_INTERPRET=1),
fresh inputs on every call."""

from __future__ import annotations

import os

import pytest
import torch

import kiln

CPP = pytest.param({}, id="cpp")
CPP_WRAPPER = pytest.param({"wrapper": "cpp"}, id="cpp_wrapper")
TRITON = pytest.param({"cpu_backend": "triton"}, id="triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1"))


def uniform_then_fill(x):
    return torch.empty(8).uniform_().fill_(0) + x


def normal_then_zero(x):
    return x * torch.empty(8).normal_().zero_()


def randperm_unused(x):
    torch.randperm(8)
    return x.cos()


def randint_plus_one_unused(x):
    _ = torch.randint(0, 5, (8,)) + 1
    return x.cos()


def multinomial_unused(x):
    torch.multinomial(torch.ones(8), 3)
    return x.sin()


def exponential_unused_between_draws(x):
    a = torch.empty(8).uniform_()
    torch.empty(8).exponential_()
    return x + a


PROGRAMS = [uniform_then_fill, normal_then_zero, randperm_unused, randint_plus_one_unused, multinomial_unused,
            exponential_unused_between_draws]


@pytest.mark.slow
@pytest.mark.parametrize("options", [CPP, CPP_WRAPPER, TRITON])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_unread_random_ops_advance_the_generator_as_eager(fn, grad, options):
    kiln.reset()
    f = kiln.compile(fn, backend="inductor", options=options)
    for i in range(3):
        x = torch.randn(8, requires_grad=grad)
        torch.manual_seed(i)
        want = fn(x)
        want_next = torch.rand(5)
        torch.manual_seed(i)
        got = f(x)
        got_next = torch.rand(5)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_next, want_next, rtol=0, atol=0)
        if grad:
            got.sum().backward()
            assert x.grad is not None


def restores_the_rng_state(x):
    state = torch.get_rng_state()
    a = torch.randn(8)
    torch.set_rng_state(state)
    return x + a - torch.randn(8)  # eager: x, the same draw twice


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_rng_state_read_and_restored_inside_is_eagers(backend):
    """``torch.get_rng_state()``/``set_rng_state()`` run in Python (graph breaks): recorded, the ATen
    trace ran them at trace time, and the second draw was a fresh one (``x + a - b`` with ``a != b``).
    kiln.inductor's own generator draws one seed per graph, so only aot_eager leaves eager's next draw."""
    kiln.reset()
    f = kiln.compile(restores_the_rng_state, backend=backend)
    for i in range(3):
        x = torch.randn(8)
        torch.manual_seed(i)
        want, want_next = restores_the_rng_state(x), torch.rand(5)
        torch.manual_seed(i)
        got, got_next = f(x), torch.rand(5)
        torch.testing.assert_close(got, want)
        if backend == "aot_eager":
            torch.testing.assert_close(got_next, want_next, rtol=0, atol=0)
