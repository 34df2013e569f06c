"""``kiln_graph::attention`` (kiln/graph/attention_op.py): attention whose kernel eager picks per call.
Its result equals ``F.scaled_dot_product_attention``'s for every mask form, and its fake result has
the declared shape and layout for symbolic sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.graph import ATTENTION


def _qkv(b: int, h: int, length: int, s: int, d: int, hk: int | None = None):
    hk = hk or h
    x = torch.randn(b, length, h, d).transpose(1, 2)  # (B, H, L, D) views of (B, L, H, D) memory, as HF makes them
    k, v = (torch.randn(b, s, hk, d).transpose(1, 2) for _ in range(2))
    return x, k, v


@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_equals_the_composite_for_every_mask_form(mask: str) -> None:
    for length in (1, 7, 33):
        q, k, v = _qkv(2, 4, length, length, 16)
        keep = torch.rand(2, 1, length, length) > 0.3
        keep[..., 0] = True
        m = {"none": None, "bool": keep, "causal": None,
             "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))}[mask]
        causal = mask == "causal"
        got = ATTENTION(q, k, v, m, causal, None, False)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal))


def test_grouped_query_attention_and_scale() -> None:
    q, k, v = _qkv(2, 8, 5, 9, 16, hk=2)
    got = ATTENTION(q, k, v, None, False, 0.3, True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True))


def test_fake_result_over_symbolic_sizes() -> None:
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.DYNAMIC,
                                                  DimDynamic.STATIC])
    q, k, v = (mode.from_tensor(t, symbolic_context=ctx) for t in _qkv(3, 4, 10, 10, 16))
    with mode:
        out = ATTENTION(q, k, v, None, True, None, False)
    b, _, length, _ = q.shape
    assert tuple(out.shape) == (b, 4, length, 16)
    assert out.stride() == (length * 64, 16, 64, 1)  # (B, L, H, D) in memory
    assert not env.guards  # no size compared


def test_opcheck() -> None:
    q, k, v = _qkv(2, 4, 6, 6, 8)
    torch.library.opcheck(ATTENTION, (q, k, v, None, False, None, False), test_utils=("test_schema", "test_faketensor"))


def test_gradients_equal_the_composites() -> None:
    """The op's backward (kiln_graph::attention_backward: the forward recomputed, eager's gradients)."""
    q, k, v = (t.requires_grad_(True) for t in _qkv(2, 4, 7, 9, 16))
    keep = torch.rand(2, 1, 7, 9) > 0.3
    keep[..., 0] = True
    g = torch.randn(2, 4, 7, 16)
    got = torch.autograd.grad(ATTENTION(q, k, v, keep, False, None, False), (q, k, v), g)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_mask_that_needs_a_gradient_is_refused() -> None:
    q, k, v = _qkv(1, 2, 3, 3, 8)
    bias = torch.zeros(1, 2, 3, 3, requires_grad=True)
    out = ATTENTION(q, k, v, bias, False, None, False)
    with pytest.raises(RuntimeError, match="the mask needs a gradient"):
        out.sum().backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_backward_equals_eager_gradients_on_cuda(mask: str) -> None:
    """The backward op (cuDNN's backward called directly where eager picks cuDNN, else a recompute under
    autograd) against eager's autograd, bf16, lengths around the kernels' alignment, fresh inputs each call."""
    from kiln.graph.attention_op import ATTENTION_BACKWARD

    for length in (1, 7, 64, 130):
        q, k, v = (t.to("cuda", torch.bfloat16) for t in _qkv(2, 4, length, length, 64))
        keep = torch.rand(2, 1, length, length, device="cuda") > 0.3
        keep[..., 0] = True
        m = {"none": None, "bool": keep, "causal": None,
             "additive": torch.zeros(keep.shape, device="cuda", dtype=torch.bfloat16).masked_fill(~keep, float("-inf"))}[mask]
        causal = mask == "causal"
        grad = torch.randn(2, 4, length, 64, device="cuda", dtype=torch.bfloat16)
        got = ATTENTION_BACKWARD(grad, q, k, v, m, causal, None, False)
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=m, is_causal=causal)
        want = torch.autograd.grad(out, (qq, kk, vv), grad)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=lambda s, n=length: f"length {n}: {s}")
