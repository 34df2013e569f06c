"""Misaligned matmuls on zero-padded operands (kiln/inductor/graph_passes/pad_matmuls.py): same results, eager's strides."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from memprobe import peak_bytes
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.decomp_bridge import ensure_meta
from kiln.inductor.graph_passes.pad_matmuls import pad_misaligned_matmuls

aten = torch.ops.aten
OPTS = InductorOptions(strict_lowering=True)


def _padded(fn, *args, block=2048):
    gm = trace(fn, *args)
    ensure_meta(gm, list(args))
    n = pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1, block=block)
    ensure_meta(gm, list(args))
    return gm, n


CASES = {
    "lm_head": (lambda x, w: x @ w.t(), (torch.randn(12, 32), torch.randn(37, 32))),
    "addmm_bias": (lambda b, x, w: torch.addmm(b, x, w.t()), (torch.randn(37), torch.randn(12, 32), torch.randn(37, 32))),
    "odd_k": (lambda a, b: a @ b, (torch.randn(16, 37), torch.randn(37, 24))),
    "odd_m_transposed_a": (lambda g, x: g.t() @ x, (torch.randn(12, 37), torch.randn(12, 24))),
    "all_odd_2d_bias": (lambda b, x, w: torch.addmm(b, x, w), (torch.randn(13, 19), torch.randn(13, 21), torch.randn(21, 19))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_padded_matmul_matches_eager_with_eager_strides(name: str) -> None:
    fn, args = CASES[name]
    gm, n = _padded(fn, *args)
    assert n == 1 and ("constant_pad_nd" in gm.code or "mm_padded" in gm.code)
    want = fn(*args)
    got = gm(*args)[0]
    assert_close(got, want)
    assert got.stride() == want.stride()  # a graph output is copied into eager's layout
    cg = compile_graph(gm, list(args), options=OPTS)  # the rewritten graph lowers (pad, slice or mm_padded)
    assert_close(cg.fn(*args)[0], want)


def test_padded_result_read_inside_the_graph_is_not_copied() -> None:
    fn = lambda x, w: torch.relu(x @ w.t()) * 2  # noqa: E731
    args = (torch.randn(12, 32), torch.randn(37, 32))
    gm, n = _padded(fn, *args)
    assert n == 1 and "clone" not in gm.code and "slice" in gm.code
    assert_close(compile_graph(gm, list(args), options=OPTS).fn(*args)[0], fn(*args))


def test_aligned_small_or_cpu_matmuls_are_left_alone() -> None:
    aligned = trace(lambda a, b: a @ b, torch.randn(16, 32), torch.randn(32, 24))
    ensure_meta(aligned, [torch.randn(16, 32), torch.randn(32, 24)])
    assert pad_misaligned_matmuls(aligned, devices=("cpu",), min_macs=0, min_dim=1) == 0
    args = (torch.randn(12, 32), torch.randn(37, 32))
    odd = trace(lambda x, w: x @ w.t(), *args)
    ensure_meta(odd, list(args))
    assert pad_misaligned_matmuls(odd) == 0  # default: CUDA tensors and large products only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpt2_lm_head_on_cuda_is_padded_and_matches_eager() -> None:
    """fp32 without TF32 (half precision runs as the Triton template: tests/autotune/test_misaligned_matmuls.py)."""
    assert not torch.backends.cuda.matmul.allow_tf32
    x = torch.randn(4096, 768, device="cuda")
    w = torch.randn(50257, 768, device="cuda") * 0.05
    fn = lambda x, w: (x @ w.t()).view(8, 512, 50257)  # noqa: E731
    cg = compile_graph(trace(fn, x, w), [x, w], options=OPTS)
    # a graph output: rows are computed in aligned chunks (a workspace of padded row length each)
    assert "_mm_padded(" in cg.texts["output_code"]
    got, want = cg.fn(x, w)[0], fn(x, w)
    exact = fn(x.double(), w.double())
    assert got.stride() == want.stride()
    # products summed in another order: compare both with the fp64 product
    err_kiln = (got.double() - exact).abs().max().item()
    err_eager = (want.double() - exact).abs().max().item()
    assert err_kiln <= 2 * err_eager + 1e-3, (err_kiln, err_eager)


def test_padded_graph_output_is_not_held_twice() -> None:
    """A graph output's product is computed a block of aligned columns at a time into eager's layout,
    its workspace inside the result's own unwritten rows: the peak is the result alone, as eager's,
    not the padded weight, the padded product and its contiguous copy (> 2x the result)."""
    x, w = torch.randn(256, 8), torch.randn(37, 8)
    fn = lambda x, w: (x @ w.t()).view(16, 16, 37)  # noqa: E731 - a view of the result leaves the graph
    gm, n = _padded(fn, x, w, block=8)
    assert n == 1 and "mm_padded" in gm.code and "clone" not in gm.code and "constant_pad_nd" not in gm.code
    cg = compile_graph(gm, [x, w], options=OPTS)
    assert "_mm_padded(" in cg.texts["output_code"]
    got = cg.fn(x, w)[0]
    assert_close(got, fn(x, w))
    assert got.stride() == fn(x, w).stride()
    eager, kiln = peak_bytes(fn, x, w), peak_bytes(cg.fn, x, w)
    assert eager == got.untyped_storage().nbytes()
    assert kiln <= eager, (kiln, eager)


@pytest.mark.parametrize("block", [4, 8, 16, 64])
@pytest.mark.parametrize("m,n", [(53, 21), (1, 21), (64, 3), (200, 37), (8, 16)])
def test_mm_padded_blocks_match_addmm(block: int, m: int, n: int) -> None:
    from kiln.inductor.graph_passes.pad_matmuls import mm_padded_blocks
    torch.manual_seed(0)
    a, w = torch.randn(m + 3, 16), torch.randn(n, 16)
    b = w.t()  # a transposed weight (nn.Linear) and a row-major one
    biases = [None, torch.randn(n), torch.randn(1, n), torch.randn(m + 3, n), torch.randn(m, n), torch.tensor(0.5)]
    for rhs in (b, b.contiguous()):
        for bias in biases:
            rows = bias[:m] if bias is not None and bias.dim() == 2 and bias.shape[0] > 1 else bias
            want = (a[:m] @ rhs) if bias is None else torch.addmm(rows, a[:m], rhs)
            got = mm_padded_blocks(bias, a, rhs, m, block)
            assert got.is_contiguous() and got.shape == (m, n)
            assert_close(got, want)


def test_cross_compiled_cuda_lm_head_output_uses_mm_padded() -> None:
    """The CUDA path (compiled for fake CUDA tensors on this host): GPT-2's head in fp32 without TF32
    (which the Triton template does not take), a graph output, runs as the wrapper's own
    ``_mm_padded`` (no padded weight, no padded product, no clone)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w.t()).view(8, 512, 50257)

    assert not torch.backends.cuda.matmul.allow_tf32
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4096, 768, device="cuda")
        w = torch.empty(50257, 768, device="cuda")
        gm = trace(head, x, w)
        cg = compile_graph(gm, [x, w], options=OPTS)
    code = cg.texts["output_code"]
    assert "_mm_padded(" in code and "def _mm_padded" in cg.portable.source and "_launch_tmpl_" not in code
    assert "constant_pad_nd" not in code and "50260" not in code


def test_one_pad_of_a_gradient_serves_both_backward_matmuls() -> None:
    """A backward multiplies the logits gradient ``g`` by the weight (K = V misaligned) and its
    transpose by the activations (M = V misaligned): both use the same padded rows of ``g``, copied
    once (GPT-2 training padded its 411 MB gradient twice per step)."""
    torch.manual_seed(0)

    def f(g, w, h):
        grad_h = g.view(-1, 37) @ w
        grad_w = g.view(-1, 37).t() @ h
        return grad_h, grad_w
    args = (torch.randn(2, 6, 37), torch.randn(37, 16), torch.randn(12, 16))
    gm, n = _padded(f, *args)
    assert n == 2
    pads = [x for x in gm.graph.nodes if x.target is aten.constant_pad_nd.default]
    padded = [x.args[0] for x in pads]
    assert sum(1 for x in padded if _shape(x) == (12, 37)) == 1, gm.code  # g's one pad (the weight has its own)
    for got, want in zip(gm(*args), f(*args)):
        assert_close(got, want)
    cg = compile_graph(gm, list(args), options=OPTS)
    for got, want in zip(cg.fn(*args), f(*args)):
        assert_close(got, want)


def _shape(n):
    v = n.meta.get("val")
    return tuple(v.shape) if v is not None else None
