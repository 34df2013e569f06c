"""End-to-end: ATen graphs through compile_graph, compared with eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import check, run_portable

from kiln.graph import CompiledGraph, PortableProgram

torch.manual_seed(0)
X = torch.randn(4, 6, 8)
IDX = torch.randint(0, 4, (5,))

CASES = {
    "cat": (lambda x: torch.cat([x, x * 2, x.sin()], 1), (X,)),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 3), value=1.5), (X,)),
    "cumsum": (lambda x: x.cumsum(1), (X,)),
    "index_select": (lambda x, i: x.index_select(0, i), (X, IDX)),
    "embedding": (lambda w, i: F.embedding(i, w), (torch.randn(10, 8), torch.randint(0, 10, (3, 4)))),
    "gather": (lambda x: torch.gather(x, 2, torch.zeros(4, 6, 3, dtype=torch.long)), (X,)),
    "index_tensor": (lambda x, i: x[i, :, 1:3], (X, IDX)),
    "negative_index": (lambda x, i: x[i], (X, torch.tensor([-1, 0, -2]))),
    "reductions": (lambda x: (x.argmax(-1), x.max(1), x.var(1), x.std(-1, keepdim=True), x.amin((0, 2)),
                              x.sum(), x.prod(1), x.argmin(), x.mean((0, 1))), (X,)),
    "any_all": (lambda x: ((x > 0).any(-1), (x > -3).all(), (x > 0).any()), (X,)),
    "views": (lambda x: x.permute(2, 0, 1).reshape(8, 24).t().contiguous() + 1, (X,)),
    "bf16": (lambda x: x.to(torch.bfloat16).sigmoid() * 3, (X,)),
    "fp16": (lambda x: x.to(torch.float16).exp(), (X,)),
    "bf16_reduce": (lambda x: x.to(torch.bfloat16).sum(-1), (X,)),
    "softmax": (lambda x: torch.softmax(x, 1) + torch.log_softmax(x, -1), (X,)),
    "bmm_extern": (lambda x, y: x.transpose(0, 1) @ y, (X, torch.randn(6, 8, 3))),
    "where_flip": (lambda x: torch.where(x > 0, x, 0.0).flip(1), (X,)),
    "int_ops": (lambda x: (x.int() // 3, x.int() % 3, x.long().abs(), x.int() * 2 - 1), (X * 10,)),
    "expand_slice": (lambda x: x.unsqueeze(0).expand(3, 4, 6, 8).sum(0) + x[:, ::2].mean(), (X,)),
    "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b)) * 2, (X, torch.randn(8), torch.randn(8))),
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, (X, torch.randn(8))),
    "linear_relu": (lambda x, w, b: F.relu(F.linear(x, w, b)), (X, torch.randn(5, 8), torch.randn(5))),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), (X,)),
    "clamp_pow": (lambda x: (x.clamp(-0.5, 0.5) ** 2, x.abs() ** 0.5, x.clamp(min=0)), (X,)),
    "nan_propagation": (lambda x: (x.amax(-1), torch.maximum(x, torch.zeros_like(x)), x.argmax(-1)),
                        (torch.where(torch.rand(4, 6, 8) < 0.1, float("nan"), X),)),
    # sign(NaN) is 0 in torch, not NaN
    "sign_nan": (lambda x: (torch.sign(x), torch.sgn(x) * 2), (torch.tensor([float("nan"), -0.0, 0.0, 2.0, -3.0]),)),
    # floor division of floats is torch's div_floor (from fmod): 1.0 // 0.1 is 9, inf // 2 is NaN, -1 // inf is -1
    "float_floordiv": (lambda a, b: (a // b, torch.div(a, b, rounding_mode="floor"), a // 0.1),
                       (torch.tensor([1.0, 7.0, -1.0, float("inf"), -1.0, 5.0, -0.0, 3.0, -3.0, 0.3]),
                        torch.tensor([0.1, 0.7, 0.1, 2.0, float("inf"), -float("inf"), 2.0, 0.0, 0.0, -0.1]))),
    # hypot does not square its operands: sqrt(x * x + y * y) overflows to inf for 1e30
    "hypot": (lambda x, y: torch.hypot(x, y) * 2, (torch.tensor([1e30, -3e25, 3.0, float("inf"), 0.0]),
                                                   torch.tensor([1e30, 4e25, -4.0, float("nan"), -0.0]))),
    # signed overflow wraps as in eager (g++ folds (x + 1) > x to true unless told it wraps)
    "int_overflow_wraps": (lambda x, y: ((x + 1) > x, (x * 2) // 2, (y - 1) < y, (y + y) >> 1),
                           (torch.tensor([2**31 - 1, -2**31, 5], dtype=torch.int32), torch.tensor([2**63 - 1, -2**63, -5]))),
    # a shift count of the width or more shifts everything out as in torch (<< gives 0, >> the sign)
    "shift_out_of_range": (lambda x: (x << 64, x >> 70, x.int() >> 40, x.int() << 33, x.to(torch.int8) >> 40),
                           (torch.arange(-18, 19) * 1001,)),  # 37: vector loop and scalar tail
    "non_contiguous_input": (lambda x: x * 2 + 1, (X.transpose(1, 2),)),
    "strided_input_view": (lambda x: x.sum(0), (X[:, 1:4],)),
    "scalar_output": (lambda x: x.sum() * 2, (X,)),
    "bool_ops": (lambda x: ((x > 0) & (x < 1), ~(x > 0), (x > 0) ^ (x < 0.5)), (X,)),
    "silu_hardswish": (lambda x: (F.silu(x), F.hardswish(x), F.leaky_relu(x, 0.2), F.hardtanh(x)), (X,)),
    "arange_iota": (lambda x: x + torch.arange(8, dtype=torch.float32), (X,)),
    "conv_bn_relu": (lambda x, w, rm, rv: F.relu(F.batch_norm(F.conv2d(x, w, padding=1), rm, rv, training=False)),
                     (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4), torch.rand(4) + 0.5)),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             (torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8))),
    "split_unbind": (lambda x: (*x.split([2, 2], 0), *x.unbind(1)), (X,)),
    "slice_scatter": (lambda x, s: torch.slice_scatter(x, s, 1, 2, 8, 2), (torch.randn(6, 10), torch.randn(6, 3))),
    "select_scatter": (lambda x, s: torch.select_scatter(x, s, 1, -1), (torch.randn(6, 10), torch.randn(6))),
    "empty_and_scalar": (lambda x, y: (x * 2, x.sum(0), y + 1), (torch.randn(0, 5), torch.tensor(3.0))),
    "column_reductions": (lambda x: (x.sum(0), x.amax(0), x.var(0)), (torch.randn(40, 24),)),
    "scatter": (lambda x, i, s: torch.scatter(x, 0, i, s), (torch.randn(6, 10), torch.randint(0, 6, (4, 10)),
                                                           torch.randn(4, 10))),
    "scatter_add": (lambda x, i, s: torch.scatter_add(x, 0, i, s), (torch.randn(6, 10), torch.randint(0, 6, (4, 10)),
                                                                   torch.randn(4, 10))),
    "scatter_value": (lambda x, i: torch.scatter(x, 1, i, 2.5), (torch.randn(6, 10), torch.randint(0, 10, (6, 3)))),
    "index_put_accumulate": (lambda w, i, g: torch.index_put(w, (i,), g, accumulate=True),
                             (torch.zeros(20, 8), torch.randint(-20, 20, (3, 5)), torch.randn(3, 5, 8))),
    "returns_input_view": (lambda x: (x.t(), x[1]), (torch.randn(5, 3),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name: str) -> None:
    fn, args = CASES[name]
    check(fn, *args)


def test_compiled_graph_contract() -> None:
    cg = check(lambda x: (x.sin() + 1).sum(-1), X)
    assert isinstance(cg, CompiledGraph)
    assert {"ir_pre_fusion", "ir_post_fusion", "output_code"} <= set(cg.texts)
    assert "def call(args)" in cg.texts["output_code"]
    assert "#pragma omp" in cg.texts["output_code"]
    assert isinstance(cg.portable, PortableProgram)
    assert any(n.endswith(".so") for n in cg.portable.files)


def test_portable_program_runs_from_its_files(tmp_path) -> None:
    """What kiln.runtime does: write FILES to a folder, exec the source with FILES_DIR, call it."""
    cg = check(lambda x: torch.softmax(x, -1) * 3, X)
    (out,) = run_portable(cg, tmp_path, [X])
    torch.testing.assert_close(out, torch.softmax(X, -1) * 3)


def test_fallback_is_reported(caplog) -> None:
    from kiln.graph import set_logs
    set_logs("perf_hints")
    try:
        import logging
        logging.getLogger("kiln.perf_hints").propagate = True
        with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
            cg = check(lambda x: torch.sort(x, -1).values.cummax(-1).values + 1, X)
        assert "fallback" in cg.texts.get("fallbacks", "")
        assert any("fallback" in r.getMessage() for r in caplog.records)
    finally:
        set_logs()


def test_random_is_seeded_by_torch_generator() -> None:
    from helpers import compile_fn
    cg = compile_fn(lambda x: F.dropout(x, 0.5, training=True), X)
    torch.manual_seed(1)
    a = cg.fn(X)[0]
    torch.manual_seed(1)
    b = cg.fn(X)[0]
    c = cg.fn(X)[0]
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
    kept = a != 0
    torch.testing.assert_close(a[kept], (X * 2)[kept])
    assert 0.35 < (~kept).float().mean().item() < 0.65


def test_rand_distribution() -> None:
    from helpers import compile_fn
    cg = compile_fn(lambda x: (torch.rand_like(x), torch.randn_like(x)), torch.empty(200, 500))
    u, n = cg.fn(torch.empty(200, 500))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert abs(n.mean().item()) < 0.02 and abs(n.std().item() - 1) < 0.02


def test_foreach_optimizer_update_fuses_per_tensor() -> None:
    from helpers import n_kernels
    n = 5
    ps = [torch.randn(10 + i) for i in range(n)]
    gs = [torch.randn_like(p) for p in ps]
    ms = [torch.randn_like(p) for p in ps]

    def f(*ts):
        p, g, m = list(ts[:n]), list(ts[n:2 * n]), list(ts[2 * n:])
        m2 = torch._foreach_lerp(m, g, 0.1)
        d = torch._foreach_addcmul(torch._foreach_mul(p, 0.99), m2, g, value=-0.01)
        return (*torch._foreach_sqrt(torch._foreach_abs(d)), *m2)
    cg = check(f, *ps, *gs, *ms)
    assert n_kernels(cg) == n  # each tensor's whole update chain is one kernel
    assert "fallbacks" not in cg.texts


def test_portable_program_rebuilds_when_the_library_does_not_load(tmp_path) -> None:
    cg = check(lambda x: x.exp() + 1, X)
    assert cg.portable is not None
    for name, data in cg.portable.files.items():
        if name.endswith(".cpp"):
            (tmp_path / name).write_bytes(data)  # ship only the source
    ns: dict = {"FILES_DIR": str(tmp_path), "FILES": {}}
    exec(compile(cg.portable.source, "<portable>", "exec"), ns)
    (out,) = ns["call"]([X])
    torch.testing.assert_close(out, X.exp() + 1)
