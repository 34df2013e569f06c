"""Large matmuls with misaligned result rows as kiln's Triton matmul template, untuned (default mode):
matmul_templates.py ``template_misaligned_matmuls``, graph_passes/pad_matmuls.py ``templated``.

The thresholds are options (``MisalignedMatmuls``): with ``devices=("cpu",)`` and no size minimum the
same decision runs on CPU tensors, whose Triton kernels run in the interpreter (conftest sets
TRITON_INTERPRET=1 when there is no GPU); fake CUDA tensors show what a GPU compile generates.
GPU tests (``-m gpu``) check GPT-2's and BERT's LM-head shapes against eager.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, MisalignedMatmuls, compile_graph
from kiln.inductor.decomp_bridge import ensure_meta
from kiln.inductor.graph_passes.pad_matmuls import pad_misaligned_matmuls, templated

aten = torch.ops.aten
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not INTERPRETER and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# every matmul counts as large here, on this host's device
SMALL = MisalignedMatmuls(devices=(DEV,), min_macs=0, min_dim=1)
OPTS = InductorOptions(strict_lowering=True, cpu_backend="triton", misaligned_matmuls=SMALL)
GIB = 1 << 30


@contextmanager
def tf32(on: bool):
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def call_code(cg) -> str:
    src = cg.texts["output_code"].split("# ---- kernels ----")[0]
    return src[src.index("\ndef call_owned(args):") :]


def test_which_matmuls_the_template_takes():
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert templated(4096, 50257, 768, bf16, GIB, 512)  # GPT-2's LM head
    assert templated(4096, 30522, 768, fp16, GIB, 512)  # BERT's
    assert not templated(4096, 32000, 768, bf16, GIB, 512)  # aligned: cuBLAS is faster there
    assert not templated(16, 50257, 768, bf16, GIB, 512)  # small: the misalignment costs little
    assert not templated(50264, 500, 4096, bf16, GIB, 512) and not templated(
        4096, 501, 50264, bf16, GIB, 512
    )
    with tf32(True):
        assert templated(4096, 50257, 768, fp32, GIB, 512)
        # 4-byte elements: a multiple of 4 is aligned
        assert not templated(4096, 50256, 768, fp32, GIB, 512)
    with tf32(False):  # IEEE fp32 stays with cuBLAS on padded operands
        assert not templated(4096, 50257, 768, fp32, GIB, 512)


def test_pad_pass_leaves_misaligned_rows_to_the_template_and_pads_the_rest():
    args = (
        torch.randn(16, 40, dtype=torch.bfloat16),
        torch.randn(37, 40, dtype=torch.bfloat16),
        torch.randn(37, dtype=torch.bfloat16),
        torch.randn(16, 37, dtype=torch.bfloat16),
    )

    def f(x, w, b, g):  # N = 37, N = 37 with a bias, K = 37 (N = 40)
        return x @ w.t(), torch.addmm(b, x, w.t()), g @ w

    gm = trace(f, *args)
    ensure_meta(gm, list(args))
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1, template=True) == 1
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    # g and w along K only
    assert sorted(tuple(p.args[1]) for p in pads) == [(0, 0, 0, 3), (0, 3, 0, 0)]
    # a 0-d bias is not one the template reads: that addmm is padded as before
    gm0 = trace(
        lambda b, x, w: torch.addmm(b, x, w.t()), torch.tensor(0.5, dtype=torch.bfloat16), *args[:2]
    )
    ensure_meta(gm0, [torch.tensor(0.5, dtype=torch.bfloat16), *args[:2]])
    assert pad_misaligned_matmuls(gm0, devices=("cpu",), min_macs=0, min_dim=1, template=True) == 1


def _check_repeatedly(fn, make_args, opts=OPTS, calls: int = 3):
    """Compile for one set of inputs, then call with fresh inputs and compare every output with eager
    (fp32 under TF32 on a GPU: within TF32's rounding, as both sides round their inputs to 10 bits; the
    two sides' roundings differ, so a K=48 sum of unit-size products can differ by ~1e-2 absolute)."""
    args = make_args()
    cg = compile_graph(trace(fn, *args), list(args), options=opts)
    for _ in range(calls):
        args = make_args()
        got, want = cg.fn(*args), flat_outputs(fn(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
            tf32_gpu = g.is_cuda and torch.backends.cuda.matmul.allow_tf32
            half = w.dtype in (torch.bfloat16, torch.float16)
            tol = dict(rtol=3e-2, atol=3e-2) if half else dict(rtol=1e-2, atol=3e-2) if tf32_gpu \
                else dict(rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(g, w, **tol)
    return cg


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV).to(dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_lm_head_output_is_the_template_storing_the_unaligned_result(dtype):
    # M = 70, K = 48, N = 101: no size a multiple of the blocks, rows of 202 bytes (not 16-byte aligned)
    fn = lambda x, w: ((x @ w.t()).view(7, 10, 101),)  # noqa: E731 - a view of the product leaves the graph
    cg = _check_repeatedly(fn, lambda: (_rand(70, 48, dtype=dtype), _rand(101, 48, dtype=dtype)))
    call = call_code(cg)
    assert (
        call.count("_launch_tmpl_mm") == 1 and "_mm_padded(" not in call and "aten.mm" not in call
    ), call
    # no pad, no copy: one kernel
    assert "constant_pad_nd" not in call and "_launch_k" not in call, call


@needs_triton
def test_bert_head_bias_and_activation_are_fused_into_the_template():
    fn = lambda x, w, b: (F.gelu(F.linear(x, w, b)),)  # noqa: E731
    cg = _check_repeatedly(fn, lambda: (_rand(70, 48), _rand(101, 48), _rand(101)))
    call = call_code(cg)
    # one kernel: the addmm's bias read by the template, the gelu its epilogue
    assert (
        call.count("_launch_tmpl_addmm") == 1
        and "_launch_k" not in call
        and "aten.addmm" not in call
    ), call


@needs_triton
def test_product_read_twice_is_stored_and_its_reader_stays_separate():
    def fn(x, w, b):
        y = F.linear(x, w, b)
        return y.float().softmax(-1), y  # a row reduction over the product, and the product itself

    cg = _check_repeatedly(fn, lambda: (_rand(70, 48), _rand(101, 48), _rand(70, 101)))
    call = call_code(cg)
    assert call.count("_launch_tmpl_addmm") == 1 and "_launch_k" in call, call


@needs_triton
def test_fp32_follows_tf32():
    fn = lambda x, w: (x @ w.t(),)  # noqa: E731
    make = lambda: (_rand(70, 48, dtype=torch.float32), _rand(101, 48, dtype=torch.float32))  # noqa: E731
    with tf32(True):  # the template's TF32 tl.dot (the interpreter computes it in fp32)
        assert "_launch_tmpl_mm" in call_code(_check_repeatedly(fn, make))
    with tf32(False):  # IEEE fp32: padded operands and cuBLAS (here: ATen), as before
        call = call_code(_check_repeatedly(fn, make))
        assert "_launch_tmpl_" not in call and "_mm_padded(" in call, call


@needs_triton
def test_aligned_or_switched_off_stays_an_extern():
    fn = lambda x, w: (x @ w.t(),)  # noqa: E731
    aligned = _check_repeatedly(fn, lambda: (_rand(72, 48), _rand(104, 48)))
    assert "_launch_tmpl_" not in call_code(aligned) and "aten.mm" in call_code(aligned)
    # M misaligned: padded rows, the result a prefix of the padded product (contiguous: no mm_padded)
    odd_m = _check_repeatedly(fn, lambda: (_rand(70, 48), _rand(104, 48)))
    assert "_launch_tmpl_" not in call_code(odd_m) and "_mm_padded(" not in call_code(odd_m)
    assert "as_strided((70, 104), (104, 1))" in call_code(odd_m), call_code(odd_m)
    off = OPTS.replace(
        misaligned_matmuls=MisalignedMatmuls(devices=(DEV,), min_macs=0, min_dim=1, template=False)
    )
    padded = _check_repeatedly(fn, lambda: (_rand(70, 48), _rand(101, 48)), opts=off)
    assert "_launch_tmpl_" not in call_code(padded) and "_mm_padded(" in call_code(padded)


class _TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(48, 48)
        self.head = torch.nn.Linear(48, 101, bias=False)  # 101 words: misaligned result rows

    def forward(self, h, target):
        logits = self.head(F.gelu(self.body(h)))
        return F.cross_entropy(logits.view(-1, 101), target.view(-1))


@needs_triton
def test_training_step_with_a_templated_head_matches_eager():
    """kiln.compile on a small LM in training: the forward's head is the template (N = 101), the
    backward's matmuls (K = 101, M = 101) run on padded operands; loss and gradients match eager
    for fresh inputs at every step. fp32 with TF32 on (which the interpreter and CPU eager ignore).
    (That such a head is the template: the compile_graph tests above; kiln.compile's graph cache may
    serve this one without compiling.)"""
    import kiln

    torch.manual_seed(0)
    model = _TinyLM().to(DEV)
    ref = _TinyLM().to(DEV)
    ref.load_state_dict(model.state_dict())
    with tf32(True):
        compiled = kiln.compile(
            model, options={"cpu_backend": "triton", "misaligned_matmuls": SMALL}
        )
        for _ in range(3):
            h, t = torch.randn(6, 12, 48, device=DEV), torch.randint(0, 101, (6, 12), device=DEV)
            loss, want = compiled(h, t), ref(h, t)
            loss.backward()
            want.backward()
            torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
                p.grad, q.grad = None, None


def test_cross_compiled_gpt2_head_is_one_template_launch():
    """The CUDA path with the default thresholds (compiled for fake CUDA tensors on this host): GPT-2's
    head, a graph output, is the template in its untuned half-precision configuration, storing straight
    into eager's [8, 512, 50257] result: no padded weight, no padded product, no copy, no cuBLAS call."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def head(x, w):
        return (x @ w.t()).view(8, 512, 50257)

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4096, 768, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(50257, 768, dtype=torch.bfloat16, device="cuda")
        cg = compile_graph(trace(head, x, w), [x, w], options=InductorOptions(strict_lowering=True))
    call = call_code(cg)
    assert call.count("_launch_tmpl_mm") == 1 and "_launch_k" not in call, call
    assert "aten.mm" not in call and "_mm_padded(" not in call and "constant_pad_nd" not in call, (
        call
    )
    # the result allocated in eager's layout, written in place
    assert "(4096, 50257), (50257, 1)" in call
    kernels = cg.texts["output_code"].split("# ---- kernels ----")[1]
    assert "BLOCK_K=64,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,warps=8,stages=3" in kernels
    assert "xmask = rn[None, :] < 50257" in kernels


# cubins come from triton's compiler: in a process without TRITON_INTERPRET (conftest may have set it)
CPP_PROGRAM = """
import sys
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
sys.path.insert(0, {tests!r})
from tracer import trace
from kiln.inductor import InductorOptions, MisalignedMatmuls
from kiln.inductor.codegen.cpp_wrapper import Slot
from kiln.inductor.cpp_program import cpp_program
opts = InductorOptions(misaligned_matmuls=MisalignedMatmuls(min_macs=0, min_dim=1))
with FakeTensorMode(allow_non_fake_inputs=True):
    x = torch.empty(70, 48, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(101, 48, dtype=torch.bfloat16, device="cuda")
    b = torch.empty(101, dtype=torch.bfloat16, device="cuda")
    gm = trace(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)
    p = cpp_program(gm, [x, w, b], {{0: Slot("input", 0), 1: Slot("constant", 0), 2: Slot("constant", 1)}},
                    options=opts, cuda_arch=90)
print(p.n_kernels, p.n_externs, *[c.function for c in p.cubins])
"""


@pytest.mark.slow
def test_cpp_wrapper_launches_the_template_as_a_cubin():
    """kiln.package / wrapper="cpp" on CUDA: the template (bias and gelu fused) is one of the program's
    Triton kernels, compiled into an sm_90 cubin that the C++ wrapper launches; no extern is left.
    (Its run on a GPU: ``test_gpu_lm_head_through_the_cpp_wrapper_matches_eager``.)"""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = CPP_PROGRAM.format(tests=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900
    )
    assert r.returncode == 0, r.stderr[-4000:]
    kernels, externs, *cubins = r.stdout.split()
    assert (
        (kernels, externs) == ("1", "0") and len(cubins) == 1 and cubins[0].startswith("tmpl_addmm")
    ), r.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "shape",
    [(8, 512, 50257, False), (8, 512, 30522, True), (4, 1024, 50257, True)],
    ids=["gpt2", "bert_bias", "gpt2_bias"],
)
def test_gpu_lm_heads_match_eager(shape):
    """GPT-2's and BERT's LM heads (bf16, 4096 x 768 @ 768 x V) with the default thresholds: one template
    launch, within bf16 accuracy of eager (both compared with the fp64 product)."""
    b, s, v, bias = shape
    torch.manual_seed(0)

    def head(x, w, *bs):
        return F.linear(x, w, *bs).view(b, s, v)

    def make():
        x = torch.randn(b * s, 768, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(v, 768, device="cuda", dtype=torch.bfloat16) * 0.05
        return (x, w, torch.randn(v, device="cuda", dtype=torch.bfloat16)) if bias else (x, w)

    args = make()
    cg = compile_graph(
        trace(head, *args), list(args), options=InductorOptions(strict_lowering=True)
    )
    assert call_code(cg).count("_launch_tmpl_") == 1
    for _ in range(3):
        args = make()
        got, want = cg.fn(*args)[0], head(*args)
        exact = head(*(a.double() for a in args))
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
        err_kiln = (got.double() - exact).abs().max().item()
        err_eager = (want.double() - exact).abs().max().item()
        assert err_kiln <= 2 * err_eager + 1e-3, (err_kiln, err_eager)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_lm_head_through_the_cpp_wrapper_matches_eager():
    """kiln.compile(options={"wrapper": "cpp"}): the template is an ordinary generated Triton kernel
    there, a cubin the C++ wrapper launches."""
    import kiln

    torch.manual_seed(0)
    head = torch.nn.Linear(768, 50257, bias=False, device="cuda", dtype=torch.bfloat16).eval()
    compiled = kiln.compile(head, options={"wrapper": "cpp"})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16)
            got, want = compiled(x), head(x)
            exact = x.double() @ head.weight.double().t()
            assert got.shape == want.shape and got.stride() == want.stride()
            assert (got.double() - exact).abs().max() <= 2 * (
                want.double() - exact
            ).abs().max() + 1e-3
