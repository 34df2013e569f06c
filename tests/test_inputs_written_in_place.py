"""Inputs that compiled kernels write through their pointers (kiln.inductor's in-place updates: an
in-place op on an argument, an optimizer step, a KV-cache write, a training BatchNorm's running
statistics) behave as eager's in-place ops: the values equal eager's after every call with fresh inputs,
and the tensors' version counters move, so that a backward which saved the old values refuses to run
instead of computing gradients from the new ones."""

from __future__ import annotations

import copy
import os
import re

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _scale_(x: torch.Tensor) -> None:
    x.mul_(2)


def test_an_in_place_write_moves_the_version_counter_every_call() -> None:
    f = kiln.compile(_scale_)
    for _ in range(3):
        x = torch.randn(64)
        want, v0 = x * 2, x._version
        f(x)
        torch.testing.assert_close(x, want)
        assert x._version > v0


def test_a_backward_that_saved_the_old_value_refuses_as_in_eager() -> None:
    for fn in (_scale_, kiln.compile(_scale_)):
        x, w = torch.randn(8), torch.randn(8, requires_grad=True)
        y = (w * x).sum()  # saves x for w's gradient
        fn(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def _block(channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                         nn.Conv2d(channels, 4, 1), nn.BatchNorm2d(4))


def _train_step_as_eager(eager: nn.Module, model: nn.Module, compiled, x: torch.Tensor, step: int) -> None:
    """One backward step of ``eager`` and of ``compiled`` (over ``model``) on ``x``: the buffers equal eager's
    after it, their version counters moved, and the gradients equal eager's (accumulated over the steps)."""
    eager(x).square().mean().backward()
    versions = [b._version for b in model.buffers()]
    compiled(x).square().mean().backward()
    assert all(b._version > v for b, v in zip(model.buffers(), versions))
    for (name, a), b in zip(eager.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("channels,size", [(8, 48), (40, 9)])
def test_batch_norm_running_statistics_are_written_in_place(stage_texts, threads: int, channels: int,
                                                            size: int) -> None:
    """Few channels over many rows and more channels than a tile over few rows, on one and two threads:
    the running statistics equal eager's after each of four steps, the forward writes them over the
    module's buffers (no separate copy back), and their version counters move as eager's. (The update
    computed by a kernel whose rows are split between threads: the next test.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        eager = _block(channels).to(memory_format=torch.channels_last)
        model = copy.deepcopy(eager)
        compiled = kiln.compile(model)
        with stage_texts("output_code") as texts:
            for step in range(4):
                torch.manual_seed(step)
                _train_step_as_eager(eager, model, compiled, torch.randn(4, 3, size, size).to(
                    memory_format=torch.channels_last), step)
    finally:
        torch.set_num_threads(before)
    forward = texts[0].text
    over = re.findall(r"reuse: buf\d+ is arg\d+", forward)
    assert len(over) >= 4, forward  # running_mean and running_var of both BatchNorms


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU needs TRITON_INTERPRET=1")
def test_batch_norm_running_statistics_written_in_place_by_triton_kernels(stage_texts) -> None:
    """The Triton path (the CUDA one, under the interpreter here): the kernels computing the running statistics
    write them over the module's buffers, equal to eager's after each of three steps (a ResNet-50 training
    step on the GPU copied 159 such buffers back one by one: ~1.5 ms of host time per step)."""
    eager = _block(8)
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model, options={"cpu_backend": "triton"})
    with stage_texts("output_code") as texts:
        for step in range(3):
            torch.manual_seed(step)
            _train_step_as_eager(eager, model, compiled, torch.randn(4, 3, 12, 12), step)
    forward = texts[0].text
    # both BatchNorms' mean, var and batch count bound to the module's buffers
    assert len(re.findall(r"buf\d+ = arg\d+  # written in place", forward)) == 6, forward


def _channel_means(x: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
    m = x.mean((0, 2, 3))
    running.mul_(0.9).add_(m * 0.1)
    return m


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(64, 8, 16, 16), (3, 40, 5, 7)])
def test_a_running_mean_written_by_its_reduction_kernel(stage_texts, threads: int, shape: tuple) -> None:
    """The update is an epilogue of the kernel computing the means; with 8 channels over 16k rows the
    rows are split between threads, and one thread writes the update over the input."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        f = kiln.compile(_channel_means)
        running = torch.randn(shape[1])
        expected = running.clone()
        with stage_texts("output_code") as texts:
            for seed in range(3):
                torch.manual_seed(seed)
                x = torch.randn(shape).to(memory_format=torch.channels_last)
                want = _channel_means(x, expected)
                torch.testing.assert_close(f(x, running), want)
                torch.testing.assert_close(running, expected)
    finally:
        torch.set_num_threads(before)
    code = texts[0].text
    assert re.search(r"reuse: buf\d+ is arg1", code), code
    if threads == 2 and shape[1] == 8:
        assert "if (kiln_tid == 0) {" in code, code


def _cache_write(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(1, pos, k)
    return cache.sum(1) * 2


def test_inference_mode_tensors_written_in_place_are_compiled() -> None:
    """A cache made under ``torch.inference_mode()`` and written by the compiled step (a serving loop): its
    fake tensors count no writes, which the capture read and failed on, so the frame ran eagerly."""
    kiln.stats_reset()
    f = kiln.compile(_cache_write)
    with torch.inference_mode():
        ours, theirs = torch.zeros(2, 8, 4), torch.zeros(2, 8, 4)
        for step in range(4):
            pos, k = torch.tensor([step]), torch.randn(2, 1, 4)
            torch.testing.assert_close(f(ours, pos, k), _cache_write(theirs, pos, k))
            torch.testing.assert_close(ours, theirs)
    stats = kiln.stats()
    assert stats.graphs_compiled >= 1 and stats.frames_run_eagerly == 0, stats
