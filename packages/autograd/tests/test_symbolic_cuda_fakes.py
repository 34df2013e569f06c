"""kiln.autograd traces graphs with symbolic sizes on fake CUDA tensors without pinning a size.

A CUDA build of torch makes fake CUDA tensors without a GPU, so the CUDA-only decisions of a trace
(attention kernels, matmul paths) run here on the CPU. Each test traces a transformer-like block whose
batch and sequence dims are symbols and checks that the ShapeEnv learned nothing that fixes either
(no replacement by a constant, no guard ``s == 3``): on the H200 such a guard made an HF Llama serving
stream compile once per size (torch 2.11's C++ ``matmul`` reads the sizes of a 3-D by 2-D product,
reached from ``F.linear`` without bias, as ints). Forward graphs only: the autograd engine needs a
CUDA context to run a backward, even on fake tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx
from torch._dynamo.source import ConstantSource  # tests only: a named source for the symbols
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import kiln.autograd as ka

D, H = 32, 4


def fake_cuda_graph(fn: Callable[..., Any], shapes: Sequence[tuple[int, ...]], dynamic: Sequence[Sequence[int]],
                    dtype: torch.dtype) -> tuple[fx.GraphModule, list[Any], ShapeEnv]:
    """``fn`` traced by fx; its placeholders' vals fake CUDA tensors of ``shapes`` whose dims in
    ``dynamic[i]`` are symbols of one ShapeEnv (as kiln.capture hands graphs to kiln.autograd)."""
    gm = fx.symbolic_trace(fn)
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    vals = []
    for i, (n, shape, dims) in enumerate(zip([n for n in gm.graph.nodes if n.op == "placeholder"], shapes, dynamic)):
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
                                                      for d in range(len(shape))])
        meta = mode.from_tensor(torch.empty(shape, device="meta"), source=ConstantSource(f"in{i}"),
                                symbolic_context=ctx)
        with mode:
            val = torch.empty(meta.shape, device="cuda", dtype=dtype)
        n.meta["val"] = val
        vals.append(val)
    return gm, vals, env


def assert_nothing_pinned(env: ShapeEnv) -> None:
    pinned = {str(s): str(e) for s, e in env.replacements.items() if e.is_number}
    assert not pinned, f"the trace fixed symbolic sizes to constants: {pinned}"
    eqs = [str(g.expr) for g in env.guards if g.expr.func.__name__ == "Equality" and
           any(a.is_number for a in g.expr.args)]
    assert not eqs, f"the trace guarded a size to a constant: {eqs}"


def block(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor,
          w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """Llama-style attention (projections without bias, causal SDPA) and an MLP with a bias."""
    b, t, _ = x.shape
    q, k, v = (F.linear(x, w).view(b, t, H, D // H).transpose(1, 2) for w in (wq, wk, wv))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(y.transpose(1, 2).reshape(b, t, D), wo)
    return x + F.silu(F.linear(x, w1, b1))[..., :D]


SHAPES = [(3, 37, D), (D, D), (D, D), (D, D), (D, D), (2 * D, D), (2 * D,)]
DYNAMIC = [(0, 1), (), (), (), (), (), ()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cuda_available", [False, True], ids=["composite_sdpa", "kiln_attention"])
def test_block_on_fake_cuda_keeps_batch_and_sequence_symbolic(dtype: torch.dtype, cuda_available: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``cuda_available`` kiln.autograd's own attention choice for symbolic sizes runs (it asks
    torch.cuda.is_available() before anything CUDA-specific); without it, torch's SDPA composite."""
    if not cuda_available and torch.cuda.is_available():
        pytest.skip("with a GPU, kiln.autograd always makes the attention choice itself")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    gm, vals, env = fake_cuda_graph(block, SHAPES, DYNAMIC, dtype)
    with torch.no_grad():
        traced = ka.trace_inference(gm, vals)
    assert_nothing_pinned(env)
    out = next(n for n in traced.gm.graph.nodes if n.op == "output").args[0][0]
    assert [str(s) for s in out.meta["val"].shape[:2]] == [str(s) for s in vals[0].shape[:2]]
    assert out.meta["val"].device.type == "cuda"
    targets = {str(n.target) for n in traced.gm.graph.nodes if n.op == "call_function"}
    fused = any("flash" in t or "efficient" in t for t in targets)
    assert fused is cuda_available, targets  # kiln's choice: flash (bf16) or memory-efficient attention


def test_linear_without_bias_on_fake_cuda_3d() -> None:
    """The op that pinned the sizes on the H200 (torch 2.11), alone."""
    def proj(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)
    gm, vals, env = fake_cuda_graph(proj, [(5, 11, D), (2 * D, D)], [(0, 1), ()], torch.bfloat16)
    with torch.no_grad():
        traced = ka.trace_inference(gm, vals)
    assert_nothing_pinned(env)
    assert not traced.joint


def div_rtn_2_11(x, y):  # type: ignore[no-untyped-def]
    """torch 2.11's pooled-size division (``torch._meta_registrations.div_rtn``): ``r != 0`` guards a parity."""
    q = x // y
    r = x % y
    if r != 0 and (bool(r < 0) != bool(y < 0)):
        q -= 1
    return q


def test_resnet_stem_on_fake_cuda_keeps_image_sizes_free_of_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard the H200 (torch 2.11) recorded for a ResNet exported with dynamic height and width,
    ``(((H + 1) // 2) + 1) % 2 != 0`` from its max pool, reproduced with torch 2.11's ``div_rtn``: the
    trace records no relation over the image sizes."""
    monkeypatch.setattr(torch._meta_registrations, "div_rtn", div_rtn_2_11)

    def stem(x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        y = F.relu(F.batch_norm(F.conv2d(x, w, stride=2, padding=3), mean, var))
        return F.adaptive_avg_pool2d(F.max_pool2d(y, 3, 2, 1), 1).flatten(1)

    gm, vals, env = fake_cuda_graph(stem, [(3, 3, 64, 64), (16, 3, 7, 7), (16,), (16,)], [(0, 2, 3), (), (), ()],
                                    torch.float32)
    with torch.no_grad():
        traced = ka.trace_inference(gm, vals)
    assert_nothing_pinned(env)
    assert not [str(g.expr) for g in env.guards if "Mod" in str(g.expr)]
    pool = next(n for n in traced.gm.graph.nodes if "max_pool2d" in str(n.target))
    assert pool.meta["val"][0].device.type == "cuda"
    h, w = vals[0].shape[2:]
    assert [{str(x) for x in s.node.expr.free_symbols} for s in pool.meta["val"][0].shape[2:]] == [
        {str(h.node.expr)}, {str(w.node.expr)}]
