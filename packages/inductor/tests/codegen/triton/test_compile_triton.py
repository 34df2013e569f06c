"""End-to-end: ATen graphs through compile_graph on the Triton path, compared with eager.

On CPU the kernels run in the Triton interpreter (``cpu_backend="triton"``); on a GPU machine the
same cases run on CUDA tensors, where compile_graph picks Triton by itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device

OPTIONS = InductorOptions(cpu_backend="triton")


def _x(*shape):
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g)


X = _x(4, 6, 8)

CASES = {
    "pointwise_chain": (lambda x: (x.sin() * 2 + x.exp()).relu() - 1, (X,)),
    "broadcast": (lambda x, b: x * b + b.tanh(), (X, _x(8))),
    "transposed_input": (lambda x: x * 2 + 1, (X.transpose(1, 2),)),
    "permute_contiguous": (lambda x: x.permute(2, 0, 1).contiguous() + 1, (X,)),
    "strided_slice": (lambda x: x[:, 1:4, ::2].sum(0), (X,)),
    "reductions": (lambda x: (x.argmax(-1), x.max(1), x.var(1), x.std(-1, keepdim=True), x.amin((0, 2)),
                              x.sum(), x.prod(1), x.argmin(), x.mean((0, 1))), (X,)),
    "any_all": (lambda x: ((x > 0).any(-1), (x > -3).all(), (x > 0).any()), (X,)),
    "softmax": (lambda x: torch.softmax(x, 1) + torch.log_softmax(x, -1), (X,)),
    "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b)) * 2, (X, _x(8), _x(8))),
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, (X, _x(8))),
    "long_rows": (lambda x: (torch.softmax(x, -1), x.sum(-1), x.argmax(-1)), (_x(2, 700),)),
    "column_sum": (lambda x: x.sum(0), (_x(300, 7),)),
    # Inception-v3's average pool of a 1x1 map in training (dropout after it): was a reduction node
    # with nothing to iterate, which the Triton writer refused outside a row kernel
    "size1_reductions": (lambda x: (x.relu().mean((2, 3)) * 2, x.amax((2, 3), keepdim=True) + 1,
                                    x.argmax(3), (x > 0).any(2), x.sum(-1).exp()), (_x(2, 5, 1, 1),)),
    "bf16": (lambda x: x.to(torch.bfloat16).sigmoid() * 3, (X,)),
    "bf16_reduce": (lambda x: x.to(torch.bfloat16).sum(-1), (X,)),
    "int_ops": (lambda x: (x.int() // 3, x.int() % 3, x.long().abs(), x.int() * 2 - 1), (X * 10,)),
    "where_flip": (lambda x: torch.where(x > 0, x, 0.0).flip(1), (X,)),
    "cumsum": (lambda x: x.cumsum(1), (X,)),
    "cat_pad": (lambda x: torch.cat([x, F.pad(x, (1, 0)).narrow(2, 0, 8) * 2], 1), (X,)),
    "gather_index": (lambda x, i: x.index_select(0, i) + 1, (X, torch.tensor([3, 0, 1]))),
    "linear_relu": (lambda x, w, b: F.relu(F.linear(x, w, b)), (X, _x(5, 8), _x(5))),
    "nan_propagation": (lambda x: (x.amax(-1), torch.maximum(x, torch.zeros_like(x)), x.argmax(-1)),
                        (torch.where(_x(4, 6, 8) > 1.5, float("nan"), X),)),
    "scalar_output": (lambda x: x.sum() * 2, (X,)),
    "index_put_accumulate": (lambda x, i, v: x.index_put((i,), v, accumulate=True) * 2,
                             (_x(6, 4), torch.tensor([0, 2, 2, 5]), _x(4, 4))),
    "scatter_add": (lambda x, i, v: x.scatter_add(0, i[:, None].expand(4, 4), v),
                    (_x(6, 4), torch.tensor([1, 1, 3, 0]), _x(4, 4))),
    # NHWC math permuted to NCHW feeding convolutions (ConvNeXt): the trace says channels-last, the
    # convolutions may return other strides; the kernels after them must not assume the traced ones
    "conv_after_permute": (lambda x, w1, w2: (F.conv2d(F.conv2d((x * 2 + 1).permute(0, 3, 1, 2), w1, stride=2),
                                                      w2, padding=3, groups=8).permute(0, 2, 3, 1) + 1
                                             ).reshape(-1, 8), (_x(2, 8, 8, 4), _x(8, 4, 2, 2), _x(8, 1, 7, 7))),
    "arange_iota": (lambda x: x + torch.arange(8, dtype=torch.float32, device=x.device), (X,)),
    # one-row matmuls are rewritten to fused reductions on the Triton path (graph_passes/gemv_as_reduction.py)
    "gemv_mm": (lambda x, w: F.silu(x @ w.t()) * 2, (_x(1, 40), _x(24, 40))),
    "gemv_addmm_bf16": (lambda x, w, b: F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()),
                        (_x(1, 64), _x(33, 64), _x(33))),
}


def _to(args, dev):
    return tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("name", list(CASES))
def test_triton_path_matches_eager(name):
    fn, args = CASES[name]
    args = _to(args, device())
    cg = compile_graph(trace(fn, *args), list(args), options=OPTIONS)
    assert "@triton.jit" in cg.texts["output_code"]
    got = cg.fn(*args)
    with torch.no_grad():
        want = flat_outputs(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            assert g == w
            continue
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == w.device, (g, w)
        tol = {"atol": 2e-2, "rtol": 2e-2} if w.dtype in (torch.bfloat16, torch.float16) else {
            "atol": 1e-5, "rtol": 1e-4}
        torch.testing.assert_close(g, w, equal_nan=True, check_stride=False, **tol)


def test_fusion_softmax_and_layer_norm_are_one_kernel_each():
    for name in ("layer_norm_gelu",):
        fn, args = CASES[name]
        args = _to(args, device())
        cg = compile_graph(trace(fn, *args), list(args), options=OPTIONS)
        assert len(cg.scheduled.kernels()) == 1, cg.texts["ir_post_fusion"]
    x = _to((_x(6, 50),), device())
    cg = compile_graph(trace(lambda x: torch.softmax(x, -1), *x), list(x), options=OPTIONS)
    assert len(cg.scheduled.kernels()) == 1, cg.texts["ir_post_fusion"]
    torch.testing.assert_close(cg.fn(*x)[0], torch.softmax(x[0], -1))


def test_one_row_matmul_is_a_generated_reduction_not_a_blas_call():
    x, w = _to((_x(1, 40), _x(24, 40)), device())
    fn = lambda x, w: F.relu(x @ w.t())  # noqa: E731
    cg = compile_graph(trace(fn, x, w), [x, w], options=OPTIONS)
    assert "aten.mm" not in cg.texts["output_code"], cg.texts["output_code"]
    torch.testing.assert_close(cg.fn(x, w)[0], fn(x, w))
    two_rows = _to((_x(2, 40),), device())[0]
    cg2 = compile_graph(trace(fn, two_rows, w), [two_rows, w], options=OPTIONS)
    assert "aten.mm" in cg2.texts["output_code"]  # real matmuls keep the BLAS extern


def test_random_numbers_statistics():
    """rand/randn through the Triton path: right moments, fresh values per call, dropout keeps scale."""
    x = torch.ones(64, 128, device=device())
    fn = lambda x: (torch.rand_like(x), torch.randn_like(x), F.dropout(x, 0.25, training=True))  # noqa: E731
    cg = compile_graph(trace(fn, x), [x], options=OPTIONS)
    u, n, d = cg.fn(x)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.02 and abs(float(u.var()) - 1 / 12) < 0.01
    assert abs(float(n.mean())) < 0.05 and abs(float(n.std()) - 1.0) < 0.05
    kept = float((d != 0).float().mean())
    assert abs(kept - 0.75) < 0.02 and torch.allclose(d[d != 0], torch.full_like(d[d != 0], 1 / 0.75))
    u2 = cg.fn(x)[0]
    assert not torch.equal(u, u2)
    assert not torch.equal(u[0], u[1])


def test_cpu_backend_triton_needs_the_interpreter(monkeypatch):
    if device() != "cpu":
        pytest.skip("about the CPU interpreter path")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(4)
    with pytest.raises(Exception, match="TRITON_INTERPRET=1"):
        compile_graph(trace(lambda x: x + 1, x), [x], options=OPTIONS)


def test_cross_compile_for_cuda_with_fake_inputs():
    """Fake CUDA inputs on a machine without a GPU: kernels are generated as text, nothing runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.randn(8, 32)
    gm = trace(lambda x: torch.softmax(x * 2, -1), real)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor(real).to("cuda") if torch.cuda.is_available() else torch.empty(
            8, 32, device="cuda")
        for n in gm.graph.nodes:  # re-describe the graph for the target device
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                n.meta["val"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
        cg = compile_graph(gm, [fake])
    assert cg.portable is not None
    src = cg.portable.source
    assert "@triton.jit" in src and "device='cuda'" in src
    assert "triton" in cg.portable.requires
