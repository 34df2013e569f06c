"""kiln.inductor lowers CUDA graphs with symbolic sizes, traced on fake CUDA tensors (a CUDA build of
torch makes them without a GPU): the decisions made for CUDA only run here on the CPU.

Flash attention (what kiln.autograd picks for bf16 attention with symbolic sizes) returns the query and
key lengths as SymInts (``max_q``/``max_k``) and its backward takes them back; kiln.inductor refused
SymInt outputs and arguments, so every bf16 HF Llama graph with symbolic sizes on the H200 ran as its
ATen graph (``inductor(symbolic: ATen fallback)``)."""

from __future__ import annotations

import sympy
import torch
from dynamic_helpers import symbolic_fakes_graph
from torch import fx

from kiln.graph import ATTENTION, ATTENTION_TARGET
from kiln.graph.attention_op import ATTENTION_BACKWARD
from kiln.inductor import InductorOptions
from kiln.inductor.ir import ExternKernel
from kiln.inductor.lowering.lower import lower_graph

aten = torch.ops.aten


def flash_forward_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> tuple:
    out, lse, cq, ck, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, cq, ck, max_q, max_k,
                                                                   0.0, True, seed, offset)
    return out * 2, dq, dk, dv


def _externs(gm: fx.GraphModule, examples: list) -> list[ExternKernel]:
    program, fallbacks = lower_graph(gm, examples, InductorOptions(strict_lowering=True), "flash")
    assert not fallbacks, fallbacks
    return [k for k in program.nodes if isinstance(k, ExternKernel)]


def test_flash_attention_forward_and_backward_lower_with_symbolic_lengths() -> None:
    shape = (2, 4, 37, 64)  # batch, heads, sequence, head dim; batch and sequence symbolic
    gm, examples, env = symbolic_fakes_graph(flash_forward_backward, [shape] * 4, {k: (0, 2) for k in range(4)},
                                             device="cuda", dtype=torch.bfloat16)
    externs = _externs(gm, examples)
    names = [e.target for e in externs]
    assert "aten._scaled_dot_product_flash_attention.default" in names, names
    bwd = next(e for e in externs if e.target == "aten._scaled_dot_product_flash_attention_backward.default")
    q_len, k_len = (str(examples[i].shape[2]) for i in (0, 1))
    sym_args = [str(a.value) for a in bwd.args if isinstance(getattr(a, "value", None), sympy.Expr)]
    assert sym_args == [q_len, k_len], bwd.as_text()  # max_q, max_k: computed from the inputs' sizes
    assert not {str(s): str(e) for s, e in env.replacements.items() if e.is_number}



def masked_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> tuple:
    return (aten._scaled_dot_product_efficient_attention(q, k, v, bias * 2, False)[0],)


def test_efficient_attention_bias_rows_are_aligned_for_a_symbolic_key_length() -> None:
    """The kernel refuses a bias whose row stride is not a multiple of 16 elements ("attn_bias is not
    correctly aligned (strideM)"); a bias computed in the graph over a symbolic key length s is stored
    in rows of 16 * ((s + 15) // 16) (on the H200 the serving stream failed with stride 28 at s = 28)."""
    shapes = [(2, 4, 37, 64)] * 3 + [(2, 4, 37, 37)]
    gm, examples, _ = symbolic_fakes_graph(masked_efficient, shapes, {0: (2,), 1: (2,), 2: (2,), 3: (2, 3)},
                                           device="cuda", dtype=torch.bfloat16)
    program, fallbacks = lower_graph(gm, examples, InductorOptions(strict_lowering=True), "bias")
    assert not fallbacks, fallbacks
    (attn,) = [e for e in program.nodes if isinstance(e, ExternKernel)]
    bias = attn.args[3]
    rows = bias.stride[2]
    for n in (1, 15, 16, 17, 28, 37, 512):
        value = int(rows.subs({sym: n for sym in rows.free_symbols}))
        assert value % 16 == 0 and value >= n, (n, value, attn.as_text())
    # the stored buffer spans the padded rows: the padding is written (zeros, as torch's pad_bias), not
    # left with what a recycled block held
    stored = program.layouts()[bias.buffer]
    assert sympy.expand(stored.shape[-1] - rows) == 0 and stored.stride[-2] == rows, (stored, attn.as_text())


def deferred_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                       g: torch.Tensor) -> tuple:
    mask = bias * 2
    out = ATTENTION(q, k, v, mask, False, None, False)
    out = ATTENTION(out, k, v, mask, False, None, False)
    grads = ATTENTION_BACKWARD(g, q, k, v, mask, False, None, False)
    return (out, *grads)


def test_deferred_attention_mask_is_stored_aligned_once_per_graph() -> None:
    """kiln_graph::attention runs eager's SDPA, which pads an unaligned mask for memory-efficient
    attention inside every call (a fill and a copy kernel per layer per token in an H200 Llama
    generate()). On CUDA the lowering stores the mask in rows of 16 * ((s + 15) // 16) instead, once
    for every call that reads it (forward and backward)."""
    shapes = [(2, 4, 37, 64)] * 3 + [(2, 1, 37, 37), (2, 4, 37, 64)]
    gm, examples, _ = symbolic_fakes_graph(deferred_attention, shapes, {0: (2,), 1: (2,), 2: (2,), 3: (2, 3), 4: (2,)},
                                           device="cuda", dtype=torch.float32)
    program, fallbacks = lower_graph(gm, examples, InductorOptions(strict_lowering=True), "deferred")
    assert not fallbacks, fallbacks
    calls = [e for e in program.nodes if isinstance(e, ExternKernel)]
    masks = [e.args[3] if e.target == ATTENTION_TARGET else e.args[4] for e in calls]
    assert len(calls) == 3 and len({m.buffer for m in masks}) == 1, [e.as_text() for e in calls]
    rows = masks[0].stride[2]
    for n in (1, 15, 16, 17, 28, 37, 512):
        value = int(rows.subs({sym: n for sym in rows.free_symbols}))
        assert value % 16 == 0 and value >= n, (n, value)


def test_deferred_attention_mask_on_the_cpu_is_passed_as_computed() -> None:
    """On the CPU eager's kernels take any mask layout: no padded copy."""
    shapes = [(2, 4, 37, 64)] * 3 + [(2, 1, 37, 37), (2, 4, 37, 64)]
    gm, examples, _ = symbolic_fakes_graph(deferred_attention, shapes, {0: (2,), 1: (2,), 2: (2,), 3: (2, 3), 4: (2,)},
                                           device="cpu", dtype=torch.float32)
    program, _ = lower_graph(gm, examples, InductorOptions(strict_lowering=True), "deferred")
    calls = [e for e in program.nodes if isinstance(e, ExternKernel)]
    rows = calls[0].args[3].stride[2]
    assert str(rows) == str(examples[3].shape[3]), calls[0].as_text()
