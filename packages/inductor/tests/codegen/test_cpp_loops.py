"""The C++ backend's loop structure: what makes CPU kernels fast, checked on the generated source, with
every result compared against eager."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from helpers import check, n_kernels


def _kernels(cg, variant: str = "parallel") -> list[str]:
    """The C++ source of each generated kernel (prelude stripped). A parallel kernel carries a serial
    copy of its loops for one-thread runs: ``variant`` picks which one is returned."""
    src = cg.texts["output_code"].split("# ---- kernels")[1]
    out = []
    for k in ['extern "C"' + k for k in src.split('extern "C"')[1:]]:
        if "if (omp_get_max_threads() > 1) {" in k:
            head, rest = k.split("if (omp_get_max_threads() > 1) {", 1)
            par, ser = rest.split("\n  } else {", 1)
            k = head + (par if variant == "parallel" else ser)
        out.append(k)
    return out


def _inner_loops(kernel: str) -> list[str]:
    return re.findall(r"for \(int64_t r0 = 0; r0 < \d+; \+\+r0\)", kernel)


def test_softmax_is_one_pass_per_stage_per_row() -> None:
    x = torch.randn(64, 1024)
    cg = check(lambda x: torch.softmax(x, -1), x)
    (k,) = _kernels(cg)
    assert k.count("#pragma omp parallel for") == 1  # rows in parallel
    assert len(_inner_loops(k)) == 3  # max, sum of exp, normalise: nothing recomputed per element
    assert k.count("std::exp(") == 1
    # the NaN flag of the max is an int |-reduction: g++ vectorises it (a bool || one ran 15x slower)
    assert "reduction(|:nan_" in k and "reduction(||" not in k


def test_layer_norm_gelu_chain_keeps_rows_in_a_row_cache() -> None:
    x = torch.randn(32, 512)
    w1, b1, w2, b2 = (torch.randn(512) for _ in range(4))

    def f(x, w1, b1, w2, b2):
        h = F.gelu(F.layer_norm(x, (512,), w1, b1))
        return F.gelu(F.layer_norm(h, (512,), w2, b2))
    cg = check(f, x, w1, b1, w2, b2, rtol=1e-4, atol=1e-5)
    (k,) = _kernels(cg)
    assert len(_inner_loops(k)) == 5  # mean, var, mean, var, output
    # each gelu's erf once: the first gelu's output is cached for the second layer norm, not recomputed
    assert k.count("std::erf(") == 2
    # the row statistics are loop-invariant: computed once per row, between the inner loops
    body = k.split("for (int64_t x0")[1]
    for stat in re.findall(r"auto (v_buf\d+) = acc_", body):
        assert body.count(f"auto {stat} =") == 1


def test_small_kernels_are_serial_simd_loops() -> None:
    small = torch.randn(8, 100)
    cg = check(lambda x: (x * 2).sin() + 1, small)
    (k,) = _kernels(cg)
    # g++ leaves `omp parallel for simd if(false)` loops unvectorised: small static sizes get no parallel
    assert "omp parallel" not in k and "#pragma omp simd" in k
    big = torch.randn(256, 1024)
    cg = check(lambda x: (x * 2).sin() + 1, big)
    (k,) = _kernels(cg)
    assert "#pragma omp parallel for" in k and " if(" not in k


def test_parallel_kernels_have_a_serial_copy_for_one_thread() -> None:
    x = torch.randn(64, 1024)
    for threads in (1, 2):  # the OpenMP thread count picks the variant at run time: both must be right
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            cg = check(lambda x: (torch.softmax(x, -1), (x * 2).sin() + 1), x)
        finally:
            torch.set_num_threads(before)
    for par, ser in zip(_kernels(cg), _kernels(cg, "serial")):
        assert "#pragma omp parallel for" in par and "omp parallel" not in ser
        assert len(_inner_loops(par)) == len(_inner_loops(ser))


def test_small_row_reductions_are_serial() -> None:
    x = torch.randn(4, 64)
    cg = check(lambda x: torch.softmax(x, -1), x)
    (k,) = _kernels(cg)
    assert "omp parallel" not in k and k.count("#pragma omp simd") == 3


def test_any_all_and_nan_propagating_max_match_eager() -> None:
    x = torch.randn(33, 300)
    x[3, 7] = float("nan")
    x[5] = 0.0

    def f(x):
        return (x > 2).any(-1), (x != 0).all(-1), x.amax(-1), x.amin(0), (x > 10).any(), (x == x).all()
    cg = check(f, x)
    src = "\n".join(_kernels(cg))
    assert "reduction(||" not in src and "reduction(&&" not in src


def test_optimizer_update_fuses_each_tensors_state_far_apart() -> None:
    """p, m and v of one tensor are written by nodes many groups apart (the loop updates every m first):
    horizontal fusion must still make them one kernel per tensor."""
    n = 12
    shapes = [(17 + 3 * i,) if i % 2 else (9 + i, 5) for i in range(n)]
    ps, gs, ms, vs = ([torch.randn(s) for s in shapes] for _ in range(4))
    vs = [v.abs() for v in vs]

    def step(*ts):
        p, g, m, v = (list(ts[k * n:(k + 1) * n]) for k in range(4))
        m2 = [mi * 0.9 + gi * 0.1 for mi, gi in zip(m, g)]
        v2 = [vi * 0.999 + gi * gi * 0.001 for vi, gi in zip(v, g)]
        p2 = [pi - 0.01 * mi / (vi.sqrt() + 1e-8) for pi, mi, vi in zip(p, m2, v2)]
        return (*p2, *m2, *v2)
    cg = check(step, *ps, *gs, *ms, *vs)
    assert n_kernels(cg) == n


def test_mean_over_hw_with_per_channel_prologue_is_not_tiled() -> None:
    """A squeeze-excitation mean of relu(batch_norm(x)) over H*W: the contiguous dim is the reduction;
    per-channel weights do not move with it and must not make the kernel tile across channels."""
    x = torch.randn(2, 24, 8, 8)
    rm, rv, w, b = torch.randn(24), torch.rand(24) + 0.5, torch.randn(24), torch.randn(24)

    def f(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-3).relu().mean((2, 3), keepdim=True)
    cg = check(f, x, rm, rv, w, b)
    (k,) = [k for k in _kernels(cg) if "acc_" in k]
    assert "xt += " not in k and len(_inner_loops(k)) == 1


def test_column_sum_is_tiled_over_the_contiguous_dim() -> None:
    x = torch.randn(300, 70)
    cg = check(lambda x: (x * 2).sum(0), x)
    (k,) = [k for k in _kernels(cg) if "acc_" in k]
    assert "xt += " in k


def test_one_compiler_call_per_graph_and_a_cache_hit_after(monkeypatch) -> None:
    """Cold compile cost is g++ start-up and parsing the prelude: every kernel of a graph goes into one
    translation unit (one g++ call, one library), and the same source is never compiled twice."""
    import subprocess
    import time

    calls: list[list[str]] = []
    real = subprocess.run

    def counting(cmd, *a, **kw):
        if "-o" in cmd:
            calls.append(cmd)
        return real(cmd, *a, **kw)
    monkeypatch.setattr(subprocess, "run", counting)  # kiln.runtime.compile_cpp runs g++ through it
    salt = float(time.time_ns() % 100003) / 7.0  # a constant no earlier run compiled

    def f(x, w):
        h = torch.softmax(x * salt, -1)
        return (h @ w).relu().sum(0), h.amax(0)
    x, w = torch.randn(16, 40), torch.randn(40, 8)
    cg = check(f, x, w)
    assert len(_kernels(cg)) >= 2 and len(calls) == 1
    libs = [n for n in cg.portable.files if n.endswith(".so")]
    assert len(libs) == 1
    check(f, x, w)
    assert len(calls) == 1  # same source: the cached library is loaded


def test_column_reduction_with_few_tiles_splits_its_rows_between_threads() -> None:
    """BatchNorm statistics over a channels-last map with 16 channels: one tile of outer points, which a
    parallel loop over tiles would leave to one thread. The rows are split between the threads and the
    partial sums combined (two stages: the variance reads the combined mean); values match eager for
    every thread count, and the outputs are stored once."""
    x = torch.randn(8, 16, 24, 24, generator=torch.Generator().manual_seed(0)).to(memory_format=torch.channels_last)

    def f(x):
        mean = x.mean((0, 2, 3))
        var = (x - mean[None, :, None, None]).square().mean((0, 2, 3))
        return mean, var, (x * 2).sum((0, 2, 3))

    before = torch.get_num_threads()
    try:
        for threads in (3, 2, 1):
            torch.set_num_threads(threads)
            # the sums of 4,608 float32 terms of size ~2 add in another order than eager's cascade: up to
            # 5e-4 apart on 40 seeds (eager is ~4e-5 from float64, kiln's sequential sum up to 5e-4)
            cg = check(f, x, atol=2e-3)
    finally:
        torch.set_num_threads(before)
    (k,) = [k for k in _kernels(cg) if "acc_" in k]
    assert "#pragma omp barrier" in k and "kiln_r0_lo" in k, k
    assert "if (kiln_tid == 0)" in k
    (serial,) = [k for k in _kernels(cg, "serial") if "acc_" in k]
    assert "barrier" not in serial


def test_column_reduction_with_many_tiles_stays_a_loop_over_tiles() -> None:
    x = torch.randn(64, 160)  # 10 tiles of 16 columns
    cg = check(lambda x: x.sum(0), x)
    (k,) = [k for k in _kernels(cg) if "acc_" in k]
    assert "xt += " in k and "barrier" not in k


def test_long_float_sums_are_as_accurate_as_eagers() -> None:
    """A float32 sum over millions of values, and column means over many rows (a tile sums each column's
    rows alone): within a few times eager's rounding error of the float64 sum (a running float sum per
    lane was 1.7e-6 of a 16M-value sum, eager's cascade 2.5e-8; column means 10-50x eager's error)."""
    from helpers import compile_fn

    torch.manual_seed(0)
    cases = [(lambda x: x.sum(), torch.rand(1 << 22) + 1.0),
             (lambda x: x.mean(0), torch.rand(1 << 14, 64) + 1.0),
             (lambda x: x.sum((0, 2, 3)), (torch.rand(64, 16, 32, 32) + 1.0).to(memory_format=torch.channels_last))]
    for fn, x in cases:
        cg = compile_fn(fn, x)
        for _ in range(2):  # fresh values, the same program
            x = torch.rand_like(x) + 1.0
            truth = fn(x.double())
            (got,) = cg.fn(x)
            err = ((got.double() - truth).abs() / truth.abs()).max().item()
            eager = ((fn(x).double() - truth).abs() / truth.abs()).max().item()
            assert err <= 4 * eager + 1e-7, (x.shape, err, eager)
    assert "double acc_" in "".join(_kernels(cg)) or "double part_" in "".join(_kernels(cg))
