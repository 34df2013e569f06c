"""Row kernels: persistent and looped reductions, multi-stage kernels (softmax, layer_norm, var), scans."""

import pytest
import torch

from kiln.inductor.codegen.triton import TritonConfig
from kiln.inductor.codegen.triton.testing import device, kernel, load, node, rs, run, strided, xs
from kiln.inductor.ir import Constant, Load, cast, op

F32 = torch.float32
PERSISTENT = TritonConfig()
LOOPED = TritonConfig(persistent_max=4, looped_rblock=16, col_tile=64)  # rows > 4 loop in chunks of 16
CONFIGS = {"persistent": PERSISTENT, "looped": LOOPED}


def _reduce_kernel(rtype, a, out_dtype, body_fn=None):
    """out[x] = reduce_r body(a[x, r]) for a 2-D ``a`` (any strides)."""
    (x0,), (r0,) = xs(1), rs(1)
    body = load("a", [x0, r0], a)
    if body_fn is not None:
        body = body_fn(body)
    return kernel(f"k_{rtype}", [a.shape[0]], [a.shape[1]],
                  [node("out", body, x0, role="outer", kind="reduction", reduction_type=rtype, dtype=out_dtype)])


EAGER = {
    "sum": lambda a: a.sum(1), "prod": lambda a: a.prod(1), "max": lambda a: a.amax(1),
    "min": lambda a: a.amin(1), "argmax": lambda a: a.argmax(1), "argmin": lambda a: a.argmin(1),
}


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("rtype", list(EAGER))
@pytest.mark.parametrize("shape", [(7, 37), (1, 100)])
def test_reduction_matches_eager(mode, rtype, shape):
    dev = device()
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(shape, generator=g) + 0.5).to(dev) if rtype == "prod" else torch.randn(shape, generator=g).to(dev)
    if rtype.startswith("arg"):
        a = a.round()  # ties: the first index must win
    out_dtype = torch.int64 if rtype.startswith("arg") else F32
    out = torch.empty(shape[0], dtype=out_dtype, device=dev)
    tk = run([_reduce_kernel(rtype, a, out_dtype)], {"a": a, "out": out}, cfg=CONFIGS[mode])
    assert tk.generated[0].kind == ("persistent_reduction" if mode == "persistent" or shape[1] <= 4
                                    else "looped_reduction")
    expected = EAGER[rtype](a)
    if out_dtype == F32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(out, expected), (out, expected)


@pytest.mark.parametrize("mode", CONFIGS)
def test_column_reduction_of_transposed_input(mode):
    dev = device()
    base = torch.randn(50, 9, device=dev)
    a = base.t()  # (9, 50) with strides (1, 9): reduce across memory rows
    out = torch.empty(9, device=dev)
    run([_reduce_kernel("sum", a, F32)], {"a": base, "out": out}, cfg=CONFIGS[mode])
    torch.testing.assert_close(out, a.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("rtype", ["max", "min", "argmax", "argmin"])
def test_nan_wins_like_torch(mode, rtype):
    dev = device()
    a = torch.randn(4, 20, device=dev)
    a[1, 5] = float("nan")
    a[2, 0] = float("nan")
    a[2, 13] = float("nan")
    out_dtype = torch.int64 if rtype.startswith("arg") else F32
    out = torch.empty(4, dtype=out_dtype, device=dev)
    run([_reduce_kernel(rtype, a, out_dtype)], {"a": a, "out": out}, cfg=CONFIGS[mode])
    expected = EAGER[rtype](a)
    if out_dtype == F32:
        torch.testing.assert_close(out, expected, equal_nan=True)
    else:
        assert torch.equal(out, expected), (out, expected)


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("rtype", ["any", "all"])
def test_any_all(mode, rtype):
    dev = device()
    a = torch.rand(6, 30, device=dev) > 0.97
    a[0] = True
    a[1] = False
    out = torch.empty(6, dtype=torch.bool, device=dev)
    run([_reduce_kernel(rtype, a, torch.bool)], {"a": a, "out": out}, cfg=CONFIGS[mode])
    assert torch.equal(out, a.any(1) if rtype == "any" else a.all(1))


@pytest.mark.parametrize("mode", CONFIGS)
def test_mean_with_epilogue_and_int_sum(mode):
    """mean = sum / n as an outer epilogue node, and a bool->int64 sum, in one kernel."""
    dev = device()
    a = torch.randn(5, 33, device=dev)
    (x0,), (r0,) = xs(1), rs(1)
    la = load("a", [x0, r0], a)
    nodes = [
        node("s", la, x0, role="outer", kind="reduction", reduction_type="sum", store=False),
        node("mean", op("truediv", Load("s", x0, F32), Constant(33.0, F32), dtype=F32), x0, role="outer"),
        node("cnt", cast(op("gt", la, Constant(0.0, F32), dtype=torch.bool), torch.int64), x0, role="outer",
             kind="reduction", reduction_type="sum"),
    ]
    mean = torch.empty(5, device=dev)
    cnt = torch.empty(5, dtype=torch.int64, device=dev)
    run([kernel("k_mean", [5], [33], nodes)], {"a": a, "mean": mean, "cnt": cnt}, cfg=CONFIGS[mode])
    torch.testing.assert_close(mean, a.mean(1))
    assert torch.equal(cnt, (a > 0).sum(1))


def _softmax_kernel(a):
    (x0,), (r0,) = xs(1), rs(1)
    la = load("a", [x0, r0], a)
    e_body = op("exp", op("sub", la, Load("mx", x0, F32), dtype=F32), dtype=F32)
    idx = strided([x0, r0], a)
    return kernel("k_softmax", [a.shape[0]], [a.shape[1]], [
        node("mx", la, x0, role="outer", kind="reduction", reduction_type="max", store=False),
        node("e", e_body, idx, stage=1, store=False),
        node("den", Load("e", idx, F32), x0, role="outer", kind="reduction", reduction_type="sum", stage=1,
             store=False),
        node("out", op("truediv", Load("e", idx, F32), Load("den", x0, F32), dtype=F32), idx, stage=2),
    ])


def test_softmax_is_one_persistent_kernel():
    dev = device()
    a = torch.randn(10, 100, device=dev)
    out = torch.empty_like(a)
    tk = run([_softmax_kernel(a)], {"a": a, "out": out})
    assert tk.generated[0].kind == "persistent_reduction"
    torch.testing.assert_close(out, a.softmax(-1))


def test_softmax_looped_recomputes_stage_locals():
    """Looped: ``e`` is not stored, so stage 2 recomputes it; requires the scheduler to mark it stored."""
    dev = device()
    a = torch.randn(3, 70, device=dev)
    k = _softmax_kernel(a)
    nodes = list(k.nodes)
    nodes[1] = node("e", nodes[1].body, nodes[1].store_index, stage=1, store=True)
    k2 = kernel("k_softmax", [3], [70], nodes)
    e = torch.empty_like(a)
    out = torch.empty_like(a)
    tk = run([k2], {"a": a, "e": e, "out": out}, cfg=LOOPED)
    assert tk.generated[0].kind == "looped_reduction"
    assert "tl.debug_barrier()" in tk.source
    torch.testing.assert_close(out, a.softmax(-1))


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("dt", [F32, torch.bfloat16])
def test_layer_norm_forward_one_kernel(mode, dt):
    """Two-pass var (mean, then sum of squared deviations), normalize, affine, as the IR asks."""
    dev = device()
    n, d = 6, 48
    a = torch.randn(n, d, device=dev).to(dt)
    w = torch.randn(d, device=dev).to(dt)
    b = torch.randn(d, device=dev).to(dt)
    (x0,), (r0,) = xs(1), rs(1)
    la = cast(load("a", [x0, r0], a), F32)
    mean = Load("mean", x0, F32)
    dev_ = op("sub", la, mean, dtype=F32)
    rstd = op("rsqrt", op("add", op("truediv", Load("ss", x0, F32), Constant(float(d), F32), dtype=F32),
                          Constant(1e-5, F32), dtype=F32), dtype=F32)
    y = op("add", op("mul", op("mul", dev_, Load("rstd", x0, F32), dtype=F32), cast(load("w", [r0], w), F32),
                     dtype=F32), cast(load("b", [r0], b), F32), dtype=F32)
    nodes = [
        node("s", la, x0, role="outer", kind="reduction", reduction_type="sum", store=False),
        node("mean", op("truediv", Load("s", x0, F32), Constant(float(d), F32), dtype=F32), x0, role="outer"),
        node("ss", op("mul", dev_, dev_, dtype=F32), x0, role="outer", kind="reduction", reduction_type="sum",
             stage=1, store=False),
        node("rstd", rstd, x0, role="outer", stage=1),
        node("out", cast(y, dt), strided([x0, r0], a), stage=2),
    ]
    out = torch.empty_like(a)
    mean_o = torch.empty(n, device=dev)
    rstd_o = torch.empty(n, device=dev)
    run([kernel("k_layer_norm", [n], [d], nodes)], {"a": a, "w": w, "b": b, "out": out, "mean": mean_o,
                                                    "rstd": rstd_o}, cfg=CONFIGS[mode])
    ref = torch.nn.functional.layer_norm(a.float(), (d,), w.float(), b.float(), 1e-5)
    torch.testing.assert_close(out, ref.to(dt), **({} if dt == F32 else {"rtol": 2e-2, "atol": 2e-2}))
    torch.testing.assert_close(mean_o, a.float().mean(1))
    torch.testing.assert_close(rstd_o, torch.rsqrt(a.float().var(1, unbiased=False) + 1e-5))


@pytest.mark.parametrize("mode", CONFIGS)
def test_reduction_over_two_inner_dims_of_permuted_input(mode):
    """Reduce dims (0, 2) of a (4, 3, 5) tensor: outer x = dim 1, inner r = (dim 0, dim 2)."""
    dev = device()
    a = torch.randn(4, 3, 5, device=dev)
    (x0,), (r0, r1) = xs(1), rs(2)
    body = load("a", [r0, x0, r1], a)
    k = kernel("k_sum02", [3], [4, 5], [node("out", body, x0, role="outer", kind="reduction", reduction_type="sum")])
    k_arg = kernel("k_argmax02", [3], [4, 5], [node("idx", body, x0, role="outer", kind="reduction",
                                                   reduction_type="argmax", dtype=torch.int64)])
    out = torch.empty(3, device=dev)
    idx = torch.empty(3, dtype=torch.int64, device=dev)
    run([k, k_arg], {"a": a, "out": out, "idx": idx}, cfg=CONFIGS[mode])
    torch.testing.assert_close(out, a.sum((0, 2)))
    assert torch.equal(idx, a.permute(1, 0, 2).reshape(3, 20).argmax(1))


@pytest.mark.parametrize("mode", CONFIGS)
@pytest.mark.parametrize("stype", ["sum", "prod"])
def test_scan_cumsum_cumprod(mode, stype):
    dev = device()
    a = torch.rand(4, 37, device=dev) + 0.5
    (x0,), (r0,) = xs(1), rs(1)
    idx = strided([x0, r0], a)
    k = kernel("k_scan", [4], [37], [node("out", load("a", [x0, r0], a), idx, kind="scan", reduction_type=stype)])
    out = torch.empty_like(a)
    run([k], {"a": a, "out": out}, cfg=CONFIGS[mode])
    torch.testing.assert_close(out, a.cumsum(1) if stype == "sum" else a.cumprod(1), rtol=1e-4, atol=1e-5)


def test_full_reduction_to_scalar():
    dev = device()
    a = torch.randn(3, 50, device=dev)
    (r0, r1) = rs(2)
    k = kernel("k_all", [], [3, 50], [node("out", load("a", [r0, r1], a), 0, role="outer", kind="reduction",
                                           reduction_type="sum")])
    out = torch.empty((), device=dev)
    run([k], {"a": a, "out": out}, cfg=LOOPED)
    torch.testing.assert_close(out, a.sum(), rtol=1e-5, atol=1e-5)
