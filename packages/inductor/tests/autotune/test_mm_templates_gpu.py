"""Matmul templates tuned for real on the GPU (the integrator runs these on the H200): a GPT-2-sized
linear + gelu, where the template with the fused epilogue competes with cuBLAS + a gelu kernel."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.autotune import AutotuneOptions, DeviceTimer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class RecordingTimer(DeviceTimer):
    def __init__(self) -> None:
        super().__init__(warmup_ms=2, rep_ms=10)
        self.timed: dict[str, float] = {}

    def __call__(self, launch, label):  # type: ignore[no-untyped-def]
        ms = super().__call__(launch, label)
        self.timed[label] = ms
        return ms


def _ms(fn, *args, iters: int = 50) -> float:
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt2_mlp_up_projection_is_tuned(tmp_path, dtype):
    x = torch.randn(8 * 128, 768, device="cuda", dtype=dtype)  # batch 8 x seq 128 tokens
    w = torch.randn(3072, 768, device="cuda", dtype=dtype) * 0.02
    b = torch.randn(3072, device="cuda", dtype=dtype)
    fn = lambda x, w, b: (F.gelu(F.linear(x, w, b), approximate="tanh"),)  # noqa: E731
    timer = RecordingTimer()
    opts = InductorOptions(max_autotune=True, autotune=AutotuneOptions(timer=timer, cache_root=str(tmp_path)))
    cg = compile_graph(trace(fn, x, w, b), [x, w, b], options=opts)
    mm = {k: v for k, v in timer.timed.items() if k == "cublas" or "BLOCK_M" in k}  # not kernel configs
    assert "cublas" in mm and len(mm) >= 5, timer.timed
    torch.testing.assert_close(cg.fn(x, w, b)[0], fn(x, w, b)[0], rtol=3e-2, atol=3e-2)
    default = compile_graph(trace(fn, x, w, b), [x, w, b], options=InductorOptions())
    tuned_ms, default_ms = _ms(cg.fn, x, w, b), _ms(default.fn, x, w, b)
    best = min(mm, key=mm.get)
    print(f"\n{dtype}: tuned {tuned_ms:.4f} ms, default {default_ms:.4f} ms; best candidate {best} "
          f"{mm[best]:.4f} ms, cuBLAS+gelu {mm['cublas']:.4f} ms")
    uses_template = "_launch_tmpl_addmm" in cg.texts["output_code"]
    assert uses_template == (best != "cublas" and mm[best] < mm["cublas"] * 0.98)
    # a second compile reads the choice from the compile cache
    again = RecordingTimer()
    opts2 = InductorOptions(max_autotune=True, autotune=AutotuneOptions(timer=again, cache_root=str(tmp_path)))
    cg2 = compile_graph(trace(fn, x, w, b), [x, w, b], options=opts2)
    assert again.timed == {} and ("_launch_tmpl_addmm" in cg2.texts["output_code"]) == uses_template


def test_template_forced_on_device_matches_eager(tmp_path):
    """Every configuration compiles and runs on the device (masked edges, bmm, fp32 with ieee dot)."""

    class LastWins:  # each site's last template configuration is the fastest
        def __init__(self) -> None:
            self.n = 0

        def __call__(self, launch, label):  # type: ignore[no-untyped-def]
            launch()
            self.n += 1
            return 1.0 if label == "cublas" else 1.0 / (1 + self.n)

    q, k = torch.randn(12, 100, 64, device="cuda"), torch.randn(12, 64, 90, device="cuda")
    x = torch.randn(300, 200, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(72, 200, device="cuda", dtype=torch.bfloat16)
    fn = lambda q, k, x, w: (torch.bmm(q, k).relu(), torch.sigmoid(x @ w.t()) * 2)  # noqa: E731
    for i in range(14):
        opts = InductorOptions(max_autotune=True, autotune=AutotuneOptions(
            timer=LastWins(), cache_root=str(tmp_path / str(i)), matmul_configs=i + 1))
        cg = compile_graph(trace(fn, q, k, x, w), [q, k, x, w], options=opts)
        got, want = cg.fn(q, k, x, w), fn(q, k, x, w)
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1], want[1], rtol=3e-2, atol=3e-2)
        assert cg.texts["output_code"].split("# ---- kernels ----")[1].count("def tmpl_") == 2
