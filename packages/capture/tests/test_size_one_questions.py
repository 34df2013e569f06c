"""Which questions about a size being 1 the capture's ShapeEnv answers without a guard (shape_env.py).

Each case makes fake tensors over size symbols of the range [1, inf) (traced at sizes >= 2) and runs
one of torch's rules; a question that would change what the rule computes at size 1 must stay a guard
(``Ne(s0, 1)`` in ``env.guards``), one that cannot must add none. Fake CUDA tensors need no GPU; the
cases that use them are skipped on a build of torch without CUDA.
"""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode  # tests only: fakes over the ShapeEnv
from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

from kiln.capture.shape_env import CaptureShapeEnv, about_one
from kiln.graph import symbolic_dispatch


def _fakes(*shapes: tuple[int, ...], dynamic: tuple[bool, ...]) -> tuple[CaptureShapeEnv, FakeTensorMode, list]:
    """A CaptureShapeEnv, its fake mode, and one fake tensor per shape whose dims marked in
    ``dynamic`` are size symbols (equal sizes share a symbol)."""
    env = CaptureShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    out = []
    for shape in shapes:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DUCK if d else DimDynamic.STATIC
                                                      for d in dynamic[:len(shape)]])
        out.append(mode.from_tensor(torch.randn(shape), symbolic_context=ctx))
    return env, mode, out


def _added(env: CaptureShapeEnv, run) -> list[str]:
    """The guards ``run`` adds, run as the capture traces: with the Python dispatcher (torch 2.11's
    C++ matmul of a 3-D by a 2-D fake tensor over symbolic sizes asks for numel() without it)."""
    n = len(env.guards)
    with symbolic_dispatch(True):
        run()
    return [str(g.expr) for g in env.guards[n:]]


def _cuda(mode: FakeTensorMode, *shape, dtype=torch.bfloat16):
    try:
        with mode:
            return torch.empty(*shape, device="cuda", dtype=dtype)
    except (RuntimeError, AssertionError) as e:
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")


def test_about_one_sees_scaled_comparisons():
    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    for e in (sympy.Eq(s0, 1), s0 * s1 < 2, sympy.Ne(1024 * s0, 1024), sympy.Lt(1024, 1024 * s0 * s1),
              sympy.Eq(64 * s0 + 64, 128), s0 < s0**2):
        assert about_one(e), e
    for e in (sympy.Eq(s0, s1), sympy.Eq(2 * s0, 6), sympy.Ne(s0, 3), sympy.Lt(s0, 8), s0 < s0**2 - 5):
        assert not about_one(e), e


def test_contiguity_asked_from_cpp_is_free_for_a_contiguous_tensor():
    """c10's symbolic contiguity asks ``guard_or_false(size == 1)`` in a quick check only: a tensor
    contiguous for every size adds no guard; one contiguous only at size 1 gets the exact condition,
    which is guarded."""
    env, mode, (x,) = _fakes((4, 7, 16), dynamic=(True, False, False))
    with mode:
        assert _added(env, lambda: x.is_contiguous()) == []
        t = torch.empty(7, x.shape[0], 16).transpose(0, 1)
        guards = _added(env, lambda: t.is_contiguous())
    assert guards and all("s" in g for g in guards), guards


def test_broadcast_gradient_size_check_of_the_engine_is_free():
    """The autograd engine asks whether a gradient's expected size is 1 (to sum a broadcast gradient);
    a gradient of the expected size needs no guard, and the input's gradient is still exact."""
    env, mode, (x, y) = _fakes((4, 16), (1, 16), dynamic=(True, False))
    with mode:
        x.requires_grad_(True)
        y.requires_grad_(True)
        out = F.gelu(x * y)
        grads = _added(env, lambda: torch.autograd.grad(out.sum(), [x, y]))
    assert not any("Ne(s" in g and ", 1)" in g for g in grads), grads


def test_linear_without_bias_on_cuda_asks_about_batch_one_only_outside_fresh_result():
    """ATen's linear over a [b, s, d] CUDA input without bias flattens the batch dims through a
    view or a copy, asking ``Ne(b, 1)`` and ``1024 < 1024*b*s`` from C++ (an H200 serving stream
    compiled a third graph for batch 1). Run as a FRESH_RESULT call it adds no guard."""
    env, mode, (x,) = _fakes((4, 128, 1024), dynamic=(True, True, False))
    b, s = x.shape[0], x.shape[1]
    h = _cuda(mode, b, s, 1024)
    w = _cuda(mode, 1024, 1024)
    with mode:
        assert _added(env, lambda: env.fresh_result(lambda: F.linear(h, w))) == []
        plain = _added(env, lambda: F.linear(h, w))
    assert any(g.startswith("Ne(s") and g.endswith(", 1)") for g in plain), plain  # the guard the rule removes


def test_attention_on_cuda_asks_about_batch_one_only_outside_fresh_result():
    """``F.scaled_dot_product_attention`` on CUDA picks its kernel from sizes (``Ne(b, 1)`` while
    broadcasting batch dims, length questions in the kernels' checks): as a FRESH_RESULT call it adds
    no guard, and its output is the same function of q, k and v."""
    env, mode, (x,) = _fakes((4, 128, 1024), dynamic=(True, True, False))
    b, s = x.shape[0], x.shape[1]
    h = _cuda(mode, b, s, 1024)
    with mode:
        q = h.view(b, s, 16, 64).transpose(1, 2)
        fresh = _added(env, lambda: env.fresh_result(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)))
        plain = _added(env, lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert fresh == [], fresh
    assert plain, "the composite asks about the batch or the length being 1 when not run as a fresh result"


def test_flash_attention_output_layout_is_free():
    """Flash attention's meta allocates its output in the query's dim order, comparing the strides
    ``1024*s`` and ``1024`` (equal only when the length is 1): it picks a layout that differs at
    length 1 only in the stride of that dim, so it adds no guard."""
    env, mode, (x,) = _fakes((4, 128, 1024), dynamic=(True, True, False))
    b, s = x.shape[0], x.shape[1]
    h = _cuda(mode, b, s, 1024)
    with mode:
        q = h.view(b, s, 16, 64).transpose(1, 2)
        added = _added(env, lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True, False))
    assert added == [], added


def test_reshape_that_copies_stays_guarded():
    """Outside those rules a size-1 question that decides aliasing stays a guard: ``t.reshape(-1)`` of
    a transposed [b, 3] copies for b >= 2 and is a view for b == 1."""
    env, mode, (x,) = _fakes((4, 3), dynamic=(True, False))
    with mode:
        added = _added(env, lambda: x.t().reshape(-1))
    assert any("Ne(s" in g and ", 1)" in g or "Eq(s" in g for g in added), added


@pytest.mark.parametrize("dynamic_length", [False, True], ids=["static-length", "dynamic-length"])
def test_reshape_that_copies_at_size_one_too_is_free(dynamic_length):
    """HF attention's ``attn_output.transpose(1, 2).reshape(b, s, -1)``: a copy at every batch (1 included),
    so the batch's size-1 question picks nothing; through the capture's ``view_or_copy`` it adds no
    guard. At length 1 the reshape is a view: the length's question stays a guard. ``x.t().reshape(-1)``
    of a [b, 3] copies at b >= 2 and is a view at b == 1: guarded (the in-place write of a later
    ``add_`` would reach ``x`` only at 1)."""
    env, mode, (x,) = _fakes((4, 2, 8, 16), dynamic=(True, False, dynamic_length, False))
    b, s = x.shape[0], x.shape[2]
    with mode:
        t = x.transpose(1, 2)
        added = _added(env, lambda: env.view_or_copy(t, "reshape", (b, s, -1), lambda: t.reshape(b, s, -1)))
    assert set(added) == ({f"Ne(16*{s}, 16)"} if dynamic_length else set()), added
    env, mode, (y,) = _fakes((4, 3), dynamic=(True, False))
    with mode:
        u = y.t()
        added = _added(env, lambda: env.view_or_copy(u, "reshape", (-1,), lambda: u.reshape(-1)))
    assert added, "the copy-or-view question at batch 1 must stay a guard"


def test_a_reshape_whose_sizes_divide_by_zero_at_size_one_is_traced() -> None:
    """Swin's window partition, ``x.view(b, h // 4, 4, w // 4, 4, c)...reshape(-1, 16, c)``, over
    symbolic h and w: asking whether the reshape copies with h or w at 1 valued ``s // (s // 4)`` there,
    which raised ZeroDivisionError inside the capture, so the frame ran eagerly on every call. A size
    that does not exist at 1 is an unknown answer: the question stays a guard, the frame compiles, and
    every call matches eager with fresh inputs."""
    import kiln

    def windows(x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        x = x.view(b, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, 16, c).mean(1)

    kiln.reset()
    kiln.stats_reset()
    compiled = kiln.compile(windows, dynamic=True)
    for n in (2, 3, 5, 8):
        x = torch.randn(2, 4 * n, 4 * (n + 1), 3)
        torch.testing.assert_close(compiled(x), windows(x))
    s = kiln.stats()
    # and kiln.inductor generates its kernels: ``h // (h // 4)`` divides by ``h // 4``, which the compile
    # assumes >= 1 as a size guard (it was refused: the graph ran op by op through ATen)
    assert s.frames_run_eagerly == 0 and s.graphs_run_eagerly == 0 and s.graphs_compiled == 1, s
