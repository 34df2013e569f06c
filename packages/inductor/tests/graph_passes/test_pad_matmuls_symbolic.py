"""A misaligned matmul over a symbolic row count (a dynamic language model's LM head: batch x length
tokens by a vocabulary of 50257) runs as ``mm_padded`` with the row count read per call; one compiled
graph serves every row count, decode-sized ones included (mm_padded then makes the plain call)."""

from __future__ import annotations

import re

import pytest
import torch
from dynamic_helpers import CPP, assumed, check_sizes, symbolic_graph

from kiln.inductor import compile_graph
from kiln.inductor.decomp_bridge import ensure_meta
from kiln.inductor.graph_passes.pad_matmuls import pad_misaligned_matmuls


def _head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def _head_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.addmm(b, x, w.t()))


@pytest.mark.parametrize("fn,extra", [(_head, ()), (_head_bias, (torch.randn(37),))], ids=["mm", "addmm_relu"])
def test_symbolic_rows_run_as_mm_padded_for_every_row_count(fn, extra) -> None:
    w = torch.randn(37, 32)
    gm, examples = symbolic_graph(fn, torch.randn(40, 32), w, *extra, dynamic={0: (0,)})
    ensure_meta(gm, examples)
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1, block=8) == 1
    ensure_meta(gm, examples)
    assert "mm_padded" in gm.code and "sym_size" in gm.code
    cg = compile_graph(gm, examples, options=CPP)
    # fresh inputs of every row count: 0 and decode sizes (no workspace room) up to many blocks
    check_sizes(cg, fn, lambda n: (torch.randn(n, 32), w, *extra), (40, 1, 2, 0, 7, 13, 97, 300))


def test_symbolic_rows_with_an_unaligned_k_pad_k_too() -> None:
    fn = _head
    w = torch.randn(37, 33)
    gm, examples = symbolic_graph(fn, torch.randn(40, 33), w, dynamic={0: (0,)})
    ensure_meta(gm, examples)
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1, block=8) == 1
    ensure_meta(gm, examples)
    assert "mm_padded" in gm.code and "constant_pad_nd" in gm.code
    cg = compile_graph(gm, examples, options=CPP)
    check_sizes(cg, fn, lambda n: (torch.randn(n, 33), w), (40, 1, 0, 7, 13, 97))


def _head_backward(g: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An LM head's backward: the logits gradient ``g`` [tokens, words] times the weight (K = words) and,
    transposed, times the hidden states (M = words, K = tokens)."""
    return g @ w, g.t() @ h


def test_head_backward_over_symbolic_tokens_pads_the_word_dim_once() -> None:
    """Both products of the backward pad the logits gradient's misaligned word dim; the symbolic token
    count (a K of the second product) is never padded nor compared: one pad, every token count right."""
    w = torch.randn(37, 16)
    gm, examples = symbolic_graph(_head_backward, torch.randn(40, 37), w, torch.randn(40, 16),
                                  dynamic={0: (0,), 2: (0,)})
    ensure_meta(gm, examples)
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1) == 2
    ensure_meta(gm, examples)
    assert gm.code.count("aten.constant_pad_nd") == 2, gm.code  # the gradient's columns (shared), the weight's rows
    assert "mm_padded" not in gm.code
    cg = compile_graph(gm, examples, options=CPP)
    assert not assumed(cg.loop_program)  # type: ignore[attr-defined]
    check_sizes(cg, _head_backward, lambda n: (torch.randn(n, 37), w, torch.randn(n, 16)), (40, 1, 0, 7, 13, 97))


def test_a_symbolic_leading_dimension_is_left_alone() -> None:
    """x [40, K] @ w [K, 37] with K symbolic: x's rows are K long in memory, aligned for some K and not
    for others; padding the static N would not make the call aligned."""
    gm, examples = symbolic_graph(lambda x, w: x @ w, torch.randn(40, 32), torch.randn(32, 37),
                                  dynamic={0: (1,), 1: (0,)})
    ensure_meta(gm, examples)
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=0, min_dim=1) == 0


def test_small_example_row_counts_are_left_alone() -> None:
    gm, examples = symbolic_graph(_head, torch.randn(4, 32), torch.randn(37, 32), dynamic={0: (0,)})
    ensure_meta(gm, examples)
    assert pad_misaligned_matmuls(gm, devices=("cpu",), min_macs=10**9, min_dim=1) == 0


def test_cross_compiled_cuda_lm_head_over_symbolic_tokens_uses_the_template() -> None:
    """The CUDA path (fake CUDA tensors on this host): GPT-2's bf16 head over a symbolic token count
    (``dynamic=True``) runs as kiln's Triton matmul template taking the row count per call, as the
    static graph does (0.55 ms on an H200 against mm_padded's 1.14), not as cuBLAS's unaligned call."""
    from dynamic_helpers import symbolic_fakes_graph

    def head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.t()

    try:
        gm, examples, _ = symbolic_fakes_graph(head, [(4096, 768), (50257, 768)], {0: (0,)}, "cuda", torch.bfloat16)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    cg = compile_graph(gm, examples, options=CPP)
    code = cg.texts["output_code"]
    body = code[code.index("def call_owned"):]
    assert "_launch_tmpl_" in body and "_mm_padded" not in body and "torch.mm(" not in body, body[:800]
    assert cg.loop_program.sizes  # type: ignore[attr-defined]  # the row count stays symbolic
    assert not assumed(cg.loop_program)  # type: ignore[attr-defined]


def test_cross_compiled_cuda_head_backward_over_symbolic_tokens_is_padded() -> None:
    """The CUDA path (fake CUDA tensors on this host): GPT-2's bf16 head backward over a symbolic token
    count runs both products on the padded gradient (cuBLAS's aligned kernels), not unaligned."""
    from dynamic_helpers import symbolic_fakes_graph

    try:
        gm, examples, _ = symbolic_fakes_graph(_head_backward, [(4096, 50257), (50257, 768), (4096, 768)],
                                               {0: (0,), 2: (0,)}, "cuda", torch.bfloat16)
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    cg = compile_graph(gm, examples, options=CPP)
    code = cg.texts["output_code"]
    body = code[code.index("def call_owned"):]
    # the gradient padded to 50264 words once, read by both products (the second through its transpose)
    # (launched in one group with the weight's pad: codegen/triton/group.py)
    pads = re.findall(r"^def k\d+_constant_pad_nd\w*\(.*, pid, XBLOCK", code, flags=re.M)
    assert len(pads) == 2 and ", 50264), (50264, 1)" in body and "_launch_group0(" in body, body[:1500]
    assert body.count("torch.mm(") == 2 and "as_strided((50264, " in body, body[:1500]
    assert not assumed(cg.loop_program)  # type: ignore[attr-defined]


def test_symbolic_rows_run_as_the_template_for_every_row_count() -> None:
    """The template over a symbolic row count (Triton on CPU tensors in the interpreter; the thresholds
    lowered so that a small product counts): one kernel, M passed per call, every M right (0 and 1
    included), an addmm's bias read in the kernel."""
    import os

    from kiln.inductor import InductorOptions, MisalignedMatmuls

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels on CPU tensors need TRITON_INTERPRET=1")
    opts = InductorOptions(strict_lowering=True, cpu_backend="triton",
                           misaligned_matmuls=MisalignedMatmuls(devices=("cpu",), min_macs=0, min_dim=1))
    w, b = torch.randn(37, 32, dtype=torch.bfloat16), torch.randn(37, dtype=torch.bfloat16)

    def head_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b, x, w.t())

    gm, examples = symbolic_graph(head_bias, torch.randn(40, 32, dtype=torch.bfloat16), w, b, dynamic={0: (0,)})
    cg = compile_graph(gm, examples, options=opts)
    code = cg.texts["output_code"]
    body = code[code.index("def call_owned"):].split("# ---- kernels ----")[0]
    assert "_launch_tmpl_" in body and "_mm_padded" not in body and "torch.addmm(" not in body, body
    check_sizes(cg, head_bias, lambda n: (torch.randn(n, 32, dtype=torch.bfloat16), w, b), (40, 1, 0, 7, 130),
                atol=2e-2, rtol=2e-2)
