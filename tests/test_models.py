"""Whole models through kiln.compile (capture -> aot -> decomp -> inductor C++) against eager, on CPU."""

from __future__ import annotations

import pytest
import torch

import kiln


def test_convnext_matches_eager() -> None:
    # ConvNeXt permutes between NCHW and NHWC around its LayerNorms; the convolutions after them once
    # returned other strides than the kernels after them assumed (max rel error 1.4 on an H200)
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny", pretrained=False, depths=(1, 1, 1, 1),
                              dims=(16, 32, 48, 64), num_classes=10).eval()
    for blk in model.modules():  # layer scale is 1e-6 at init, which would hide the blocks' output
        if getattr(blk, "gamma", None) is not None:
            torch.nn.init.normal_(blk.gamma)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = model(x)
        got = kiln.compile(model)(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_convnext_with_dynamic_sizes_compiles_one_graph_of_kernels() -> None:
    """dynamic=True over ConvNeXt's batch and image size: its reshapes of the (h, h) feature maps (h = H
    // 4) give size expressions such as ``h**2 // (2*h)``, which kiln.inductor refused (a divisor it
    could not prove positive), so the whole graph ran op by op through ATen (0.66x the static graph's
    speed on an H200). Now generated kernels serve every size (batch 1 apart), fresh inputs each call."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny", pretrained=False, depths=(1, 1, 1, 1),
                              dims=(16, 32, 48, 64), num_classes=10).eval()
    for blk in model.modules():
        if getattr(blk, "gamma", None) is not None:
            torch.nn.init.normal_(blk.gamma)
    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(model, dynamic=True)
    with torch.no_grad():
        for batch, size in ((2, 64), (3, 96), (1, 64), (2, 80), (4, 128)):
            x = torch.randn(batch, 3, size, size)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    s = kiln.stats()
    # batch 1 recompiles once (0/1 specialisation of the batch symbol, as torch.compile does)
    assert s.graphs_compiled <= 2 and s.recompiles <= 1, s
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s  # the ATen fallback counts here


def test_roll_by_a_size_dependent_shift_compiles_for_every_size() -> None:
    """``torch.roll`` over a symbolic dim (a shifted-window model's cyclic shift at a dynamic image size)
    normalises its shift as ``shift % s``; kiln.inductor refused that divisor and ran the graph op by op.
    Fresh inputs per call, sizes 1 and primes included."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x, shifts=(x.shape[1] // 3, -2), dims=(1, 2)) * 2 + 1

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(f, dynamic=True)
    for n in (6, 7, 1, 13, 32):
        x = torch.randn(2, n, n + 3)
        torch.testing.assert_close(compiled(x), f(x))
    s = kiln.stats()
    assert s.graphs_compiled <= 2 and (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s


def test_a_divisor_assumed_positive_is_a_size_guard_that_recompiles() -> None:
    """``torch.roll`` over ``x[: n // 4]`` divides by ``n // 4``, 0 for n < 4: the compile assumes it >= 1
    as a size guard checked per call, so a call with n < 4 recompiles instead of dividing by zero in a
    kernel; every call matches eager with fresh inputs."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x[: x.shape[0] // 4], 1, 0) * 2

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(f, dynamic=True)
    for n in (8, 12, 9, 3, 2, 16, 13):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    s = kiln.stats()
    assert (s.graphs_run_eagerly, s.frames_run_eagerly) == (0, 0), s
