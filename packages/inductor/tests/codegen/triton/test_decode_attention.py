"""Decode attention (decode_attention.py): attention of one query row per head as kiln's Triton kernel
instead of the library call. Compared with eager over several calls with fresh inputs and cache
positions (masks that cut the cache mid-block, at a block edge, at position 0, everything masked);
calls the kernel does not take keep the extern. Under the interpreter on CPU here, on the GPU there
(conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import compile_symbolic
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.decode_attention import TARGET_PROGRAMS, DecodeAttentionKernel

OPTIONS = InductorOptions(cpu_backend="triton", decode_attention=True)


def _rand(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device(), dtype=dtype)


def _templates(cg) -> list[DecodeAttentionKernel]:
    return [w for w in cg.scheduled.launched() if isinstance(w, DecodeAttentionKernel)]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor]:
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=m),)


def _mask(kind: str, pos: int, s: int) -> torch.Tensor:
    keep = (torch.arange(s, device=device()) <= pos).view(1, 1, 1, s)
    if kind == "bool":
        return keep
    return torch.where(keep, 0.0, float("-inf")).to(torch.float32) + torch.zeros(1, 3, 1, 1, device=device())


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("d", [16, 40])
def test_one_query_over_a_masked_cache_matches_eager(kind: str, d: int) -> None:
    b, h, s = 2, 3, 300  # 300 positions: three blocks of 128, the last one partial
    args = [_rand(0, b, h, 1, d), _rand(1, b, h, s, d), _rand(2, b, h, s, d), _mask(kind, 10, s)]
    cg = compile_graph(trace(_attend, *args), args, options=OPTIONS)
    assert [t.splits for t in _templates(cg)] == [4], cg.texts["ir_post_fusion"]  # 4 programs per head, then a sum
    for call, pos in enumerate([0, 5, 127, 128, 200, 299, -1]):  # -1: every position masked (eager gives zeros)
        q, k, v = _rand(10 + call, b, h, 1, d), _rand(20 + call, b, h, s, d), _rand(30 + call, b, h, s, d)
        m = _mask(kind, pos, s)
        torch.testing.assert_close(cg.fn(q, k, v, m)[0], _attend(q, k, v, m)[0], atol=1e-5, rtol=1e-4)


def test_no_mask_half_precision_and_a_scale() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.scaled_dot_product_attention(q, k, v, scale=0.3),)

    dt = torch.bfloat16
    args = [_rand(0, 1, 4, 1, 32, dtype=dt), _rand(1, 1, 4, 270, 32, dtype=dt), _rand(2, 1, 4, 270, 32, dtype=dt)]
    cg = compile_graph(trace(f, *args), args, options=OPTIONS)
    assert len(_templates(cg)) == 1
    for call in range(3):
        fresh = [_rand(10 * call + i, *a.shape, dtype=dt) for i, a in enumerate(args)]
        got, want = cg.fn(*fresh)[0], f(*fresh)[0]
        assert got.dtype == dt
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_transposed_cache_layout_matches_eager() -> None:
    # keys and values as (b, s, h, d) memory viewed (b, h, s, d): the kernel follows the strides
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2)),)

    args = [_rand(0, 2, 3, 1, 16), _rand(1, 2, 50, 3, 16), _rand(2, 2, 50, 3, 16)]
    cg = compile_graph(trace(f, *args), args, options=OPTIONS)
    assert [t.splits for t in _templates(cg)] == [1]  # 50 positions: one program per head, no workspace
    for call in range(2):
        fresh = [_rand(5 * call + i, *a.shape) for i, a in enumerate(args)]
        torch.testing.assert_close(cg.fn(*fresh)[0], f(*fresh)[0], atol=1e-5, rtol=1e-4)


def test_two_query_rows_and_the_option_off_keep_the_library_call() -> None:
    args = [_rand(0, 1, 2, 2, 16), _rand(1, 1, 2, 30, 16), _rand(2, 1, 2, 30, 16), _mask("bool", 7, 30)]
    cg = compile_graph(trace(_attend, *args), args, options=OPTIONS)
    assert not _templates(cg)
    torch.testing.assert_close(cg.fn(*args)[0], _attend(*args)[0], atol=1e-5, rtol=1e-4)
    one = [_rand(0, 1, 2, 1, 16), *args[1:]]
    off = compile_graph(trace(_attend, *one), one, options=InductorOptions(cpu_backend="triton", decode_attention=False))
    assert not _templates(off)
    on = compile_graph(trace(_attend, *one), one, options=InductorOptions(cpu_backend="triton"))
    assert len(_templates(on)) == 1  # on by default


def test_a_growing_cache_over_symbolic_key_counts() -> None:
    # HF's DynamicCache: the key count (and the batch) symbolic, one compiled graph for every length
    def f(q: torch.Tensor, k: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor]:
        v = k.flip(-1) * 0.5 + 1  # values of the keys' length (one size symbol for both)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m),)

    b, h, d = 2, 3, 16
    args = [_rand(0, b, h, 1, d), _rand(1, b, h, 37, d), torch.zeros(b, 1, 1, 37, device=device())]
    cg = compile_symbolic(f, *args, options=OPTIONS, dynamic={0: (0,), 1: (0, 2), 2: (0, 3)})
    assert len(_templates(cg)) == 1 and cg.loop_program.sizes  # type: ignore[attr-defined]
    for call, (bb, s) in enumerate([(2, 37), (2, 38), (3, 129), (1, 2), (2, 300)]):
        q, k = _rand(10 + call, bb, h, 1, d), _rand(20 + call, bb, h, s, d)
        m = torch.where(torch.rand(bb, 1, 1, s, generator=torch.Generator().manual_seed(call)) < 0.8, 0.0,
                        float("-inf")).to(device())
        torch.testing.assert_close(cg.fn(q, k, m)[0], f(q, k, m)[0], atol=1e-5, rtol=1e-4)


def test_a_growing_cache_split_over_programs() -> None:
    # a symbolic key count divided among the splits at run time: one split's stretch grows with the count, and
    # splits past the last position write nothing but their empty state
    def f(q: torch.Tensor, kv: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=m),)

    h, d = 2, 16
    args = [_rand(0, 1, h, 1, d), _rand(1, 2, 1, h, 200, d), torch.zeros(1, 1, 1, 200, device=device())]
    cg = compile_symbolic(f, *args, options=OPTIONS, dynamic={1: (3,), 2: (3,)})
    # a symbolic key count: about TARGET_PROGRAMS programs (2 heads: 128 splits), most of them empty here
    assert [t.splits for t in _templates(cg)] == [TARGET_PROGRAMS // h] and cg.loop_program.sizes  # type: ignore[attr-defined]
    for call, s in enumerate([200, 201, 64, 1, 65, 700, 129, 3000]):
        q, kv = _rand(10 + call, 1, h, 1, d), _rand(20 + call, 2, 1, h, s, d)
        keep = torch.rand(1, 1, 1, s, generator=torch.Generator().manual_seed(call)) < 0.7
        keep[..., -1] = True
        m = torch.where(keep, 0.0, float("-inf")).to(device())
        torch.testing.assert_close(cg.fn(q, kv, m)[0], f(q, kv, m)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("s", "d", "mask_shape"), [(100, 16, (2, 1, 1, 1)), (1, 16, (2, 1, 1, 1)), (50, 1, None)])
def test_a_dim_of_one_under_a_block_index_matches_eager(s: int, d: int, mask_shape: tuple | None) -> None:
    # a mask of one value per batch row (broadcast over the positions), one cached key (a one-token prompt),
    # a head dim of 1: the load's offset has no term for the block index, its pointer must still be a block
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *m: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m[0] if m else None),)

    shapes = [(2, 3, 1, d), (2, 3, s, d), (2, 3, s, d)] + ([mask_shape] if mask_shape else [])
    args = [_rand(i, *sh) for i, sh in enumerate(shapes)]
    cg = compile_graph(trace(f, *args), args, options=OPTIONS)
    assert len(_templates(cg)) == 1
    for call in range(3):
        fresh = [_rand(10 * call + i, *sh) for i, sh in enumerate(shapes)]
        torch.testing.assert_close(cg.fn(*fresh)[0], f(*fresh)[0], atol=1e-5, rtol=1e-4)
