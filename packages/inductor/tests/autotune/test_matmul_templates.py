"""max-autotune's matmul templates in the pipeline (matmul_templates.py, autotune/matmul_template_kernel.py).

On CPU the kernels run in the Triton interpreter (conftest sets TRITON_INTERPRET=1 when there is no
GPU) and a FakeTimer decides who wins; on a GPU the same tests run on the device.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.autotune import AutotuneOptions, FakeTimer
from kiln.inductor.autotune.matmul_template_kernel import (
    MatmulSpec,
    Operand,
    TemplateKernel,
    template_configs,
)
from kiln.inductor.matmul_templates import _groups, find_sites

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                       reason="Triton kernels need a GPU or TRITON_INTERPRET=1"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked lanes of the interpreter
]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TEMPLATE_WINS = {"cublas": 1.0}  # every template configuration costs the FakeTimer's default 0.5
CUBLAS_WINS = {"cublas": 0.1}


def options(tmp_path, times, configs: int = 1) -> tuple[InductorOptions, FakeTimer]:
    timer = FakeTimer(times, default=0.5)
    # kernel_configs=1: the generated kernels keep their one configuration (not timed): only matmuls are
    at = AutotuneOptions(matmul_configs=configs, kernel_configs=1, timer=timer, cache_root=str(tmp_path / "cache"),
                         progress=False)
    return InductorOptions(cpu_backend="triton", max_autotune=True, autotune=at), timer


def compile_and_check(fn, args, opts, tol: float = 1e-4):
    cg = compile_graph(trace(fn, *args), list(args), options=opts)
    got = cg.fn(*args)
    want = flat_outputs(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        half = {w.dtype, args[0].dtype} & {torch.bfloat16, torch.float16}  # half inputs: half-precision results
        t = 3e-2 if half else tol
        torch.testing.assert_close(g, w, rtol=t, atol=t)
    return cg


def call_code(cg) -> str:
    src = cg.texts["output_code"]
    return src[src.index("\ndef call(args):"):src.index("# ---- kernels ----")]


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype)


EPILOGUES = {
    "bias": lambda x, w, b, r: (F.linear(x, w, b),),
    "relu": lambda x, w, b, r: (torch.relu(x @ w.t()),),
    "bias_gelu": lambda x, w, b, r: (F.gelu(F.linear(x, w, b)),),
    "bias_tanh_gelu_residual": lambda x, w, b, r: (F.gelu(F.linear(x, w, b), approximate="tanh") + r,),
    "cast": lambda x, w, b, r: ((x @ w.t() * 0.5).to(torch.float16 if x.dtype == torch.float32 else torch.float32),),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_template_with_fused_epilogue_matches_eager(tmp_path, name, dtype):
    # 33 x 40 @ 40 x 24: no size is a multiple of the (clipped) blocks, every edge is masked
    x, w, b, r = rand(33, 40, dtype=dtype), rand(24, 40, dtype=dtype), rand(24, dtype=dtype), rand(33, 24, dtype=dtype)
    opts, timer = options(tmp_path, TEMPLATE_WINS)
    cg = compile_and_check(EPILOGUES[name], (x, w, b, r), opts)
    call = call_code(cg)
    assert "_launch_tmpl_" in call and "aten.mm" not in call and "aten.addmm" not in call, call
    # one kernel: the template with the epilogue fused (the pointwise kernel is gone)
    assert call.count("_launch_tmpl_") == 1 and "_launch_k" not in call, call
    assert timer.timed[0] == "cublas" and len(timer.timed) == 2


def test_bmm_template_with_epilogue(tmp_path):
    q, k = rand(3, 17, 20), rand(3, 20, 19)
    fn = lambda q, k: (torch.softmax(torch.bmm(q, k) * 0.3, -1), torch.bmm(q, k).sigmoid())  # noqa: E731
    opts, _ = options(tmp_path, TEMPLATE_WINS)
    cg = compile_and_check(fn, (q, k), opts)
    assert "_launch_tmpl_bmm" in call_code(cg)


def test_transposed_operands_and_batched_broadcast(tmp_path):
    a, b = rand(40, 33), rand(24, 40)
    fn = lambda a, b, c: (a.t() @ b.t() + 1.0, torch.bmm(c, b.t().expand(2, 40, 24)))  # noqa: E731
    c = rand(2, 5, 40)
    opts, _ = options(tmp_path, TEMPLATE_WINS)
    cg = compile_and_check(fn, (a, b, c), opts)
    assert call_code(cg).count("_launch_tmpl_") == 2


def test_cublas_wins_keeps_the_extern_and_a_separate_epilogue(tmp_path):
    x, w, b = rand(33, 40), rand(24, 40), rand(24)
    opts, timer = options(tmp_path, CUBLAS_WINS, configs=2)
    cg = compile_and_check(lambda x, w, b: (F.gelu(F.linear(x, w, b)),), (x, w, b), opts)
    call = call_code(cg)
    assert "aten.addmm" in call and "_launch_tmpl_" not in call
    assert timer.timed.count("cublas") == 1 and len(timer.timed) == 3


def test_second_compile_hits_the_cache(tmp_path):
    x, w, b = rand(33, 40), rand(24, 40), rand(24)
    fn = lambda x, w, b: (torch.relu(F.linear(x, w, b)),)  # noqa: E731
    opts, timer = options(tmp_path, TEMPLATE_WINS, configs=2)
    first = compile_and_check(fn, (x, w, b), opts)
    assert timer.timed
    opts2, timer2 = options(tmp_path, CUBLAS_WINS, configs=2)  # would choose cuBLAS if it timed anything
    second = compile_and_check(fn, (x, w, b), opts2)
    assert timer2.timed == []
    assert call_code(second) == call_code(first) and "_launch_tmpl_addmm" in call_code(second)


def test_product_read_elsewhere_is_stored_and_unfusable_reader_stays_separate(tmp_path):
    x, w = rand(24, 40), rand(24, 40)
    # y + y.t() reads the product at two points: not an epilogue; y is also returned
    def fn(x, w):
        y = x @ w.t()
        return y + y.t(), y

    opts, _ = options(tmp_path, TEMPLATE_WINS)
    cg = compile_and_check(fn, (x, w), opts)
    call = call_code(cg)
    assert call.count("_launch_tmpl_mm") == 1 and "_launch_k" in call, call


def test_epilogue_sees_the_product_rounded_to_its_dtype(tmp_path):
    # bf16 product then an fp32 op: the fused epilogue must round like the unfused kernel reading memory
    # small integers: every sum is exact in fp32, only the bf16 rounding of the product (sums past 256
    # lose their low bits) can differ, so the results must be equal
    x = torch.randint(-16, 17, (32, 128), device=DEV).to(torch.bfloat16)
    w = torch.randint(-16, 17, (16, 128), device=DEV).to(torch.bfloat16)
    fn = lambda x, w: ((x @ w.t()).float() * 3.0,)  # noqa: E731
    opts, _ = options(tmp_path, TEMPLATE_WINS)
    cg = compile_graph(trace(fn, x, w), [x, w], options=opts)
    want = fn(x, w)[0]
    assert (want != (x.float() @ w.float().t()) * 3.0).any()  # the rounding matters for these inputs
    torch.testing.assert_close(cg.fn(x, w)[0], want, rtol=0, atol=0)


def test_cross_compiling_leaves_externs_and_says_so(caplog):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w = torch.randn(32, 64), torch.randn(16, 64)
    gm = trace(lambda x, w: (torch.relu(x @ w.t()),), x, w)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fx_, fw = mode.from_tensor(x).to("cuda"), mode.from_tensor(w).to("cuda")
    if torch.cuda.is_available():
        pytest.skip("cross-compiling means no device")
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        cg = compile_graph(gm, [fx_, fw], options=InductorOptions(max_autotune=True))
    assert "aten.mm" in call_code(cg)
    assert any("no CUDA device here" in r.getMessage() and "matmul" in r.getMessage() for r in caplog.records)


def test_groups_of_merged_loop_dims():
    assert _groups((8, 32), (256,)) == [[0, 1]]
    assert _groups((8, 32), (8, 32)) == [[0], [1]]
    assert _groups((2, 4, 32), (8, 32)) == [[0, 1], [2]]
    assert _groups((1, 4, 32), (128,)) == [[1, 2]]
    assert _groups((8, 32), (16, 16)) is None
    assert _groups((8, 32), (8,)) is None


def test_configs_are_clipped_to_the_problem():
    op = Operand("a", 0, (0, 40, 1))
    spec = MatmulSpec("mm", 1, 33, 24, 40, op, op, None, op, torch.float32)
    for c in template_configs(spec):
        assert 16 <= c.get("BLOCK_M") <= 64 and 16 <= c.get("BLOCK_N") <= 32 and 16 <= c.get("BLOCK_K") <= 64
    assert len(template_configs(spec, limit=3)) == 3


def test_sites_in_the_schedule(tmp_path):
    x, w, b, r = rand(8, 16), rand(32, 16), rand(32), rand(8, 32)
    fn = lambda x, w, b, r: (F.gelu(F.linear(x, w, b)) + r, torch.relu(x @ w.t()))  # noqa: E731
    cg = compile_graph(trace(fn, x, w, b, r), [x, w, b, r], options=InductorOptions(cpu_backend="triton"))
    sites = find_sites(cg.scheduled)
    assert [s.spec.op for s in sites] == ["addmm", "mm"]
    # horizontal fusion put both epilogues in one kernel: the first site takes it, the second has none
    assert sites[0].epilogue is not None and sites[1].epilogue is None
    assert isinstance(sites[0].template, TemplateKernel) and sites[0].template.store_product is False
    assert sites[1].template.store_product is True


def test_identical_layers_are_tuned_once(tmp_path):
    x, w1, b1, w2, b2 = rand(24, 32), rand(32, 32), rand(32), rand(32, 32), rand(32)
    fn = lambda x, w1, b1, w2, b2: (torch.relu(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)),)  # noqa: E731
    opts, timer = options(tmp_path, TEMPLATE_WINS, configs=2)
    cg = compile_and_check(fn, (x, w1, b1, w2, b2), opts)
    assert timer.timed.count("cublas") == 1 and len(timer.timed) == 3  # the second layer reads the cache
    assert call_code(cg).count("_launch_tmpl_addmm") == 2


def test_a_failing_tuning_keeps_the_extern_and_says_so(tmp_path, monkeypatch, caplog):
    import kiln.inductor.matmul_templates as mt

    def boom(*a, **k):
        raise RuntimeError("scratch buffers unavailable")

    monkeypatch.setattr(mt, "buffers_for", boom)
    x, w = rand(24, 40), rand(24, 40)
    opts, _ = options(tmp_path, TEMPLATE_WINS)
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"):
        cg = compile_and_check(lambda x, w: (torch.relu(x @ w.t()),), (x, w), opts)
    assert "aten.mm" in call_code(cg) and "_launch_tmpl_" not in call_code(cg)
    assert any("stays a cuBLAS extern" in r.getMessage() and "scratch buffers" in r.getMessage()
               for r in caplog.records)
