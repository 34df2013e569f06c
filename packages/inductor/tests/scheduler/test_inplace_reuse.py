"""Intermediates written over by the pointwise kernel that reads them last (scheduler/inplace.py,
plan_inplace_reuse): one buffer where eager holds two, results unchanged."""

from __future__ import annotations

import torch
from helpers import assert_close
from memprobe import peak_bytes
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph

OPTS = InductorOptions(strict_lowering=True)


def _tied_grads(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # two matmul results summed (a tied weight's gradients): the sum can take the first's memory
    return (torch.mm(x, w) + torch.mm(y, w) * 0.5,)


def test_dying_input_is_written_over_and_peak_drops_below_eager() -> None:
    torch.manual_seed(0)
    args = (torch.randn(64, 32), torch.randn(32, 48), torch.randn(64, 32))
    cg = compile_graph(trace(_tied_grads, *args), list(args), options=OPTS)
    code = cg.texts["output_code"]
    assert "# reuse" in code and " over " in cg.texts["ir_post_fusion"]
    assert_close(cg.fn(*args)[0], _tied_grads(*args)[0])
    one = 64 * 48 * 4
    eager, kiln = peak_bytes(_tied_grads, *args), peak_bytes(cg.fn, *args)
    # eager: both products and the sum (the scaled one freed as it goes): 3 buffers at its peak;
    # kiln: both products, the sum written over the first
    assert eager >= 3 * one and kiln <= 2 * one, (eager, kiln)


def test_input_read_at_another_index_is_not_written_over() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.mm(x, w)
        return (t + t.flip(0),)
    args = (torch.randn(16, 8), torch.randn(8, 16))
    cg = compile_graph(trace(f, *args), list(args), options=OPTS)
    assert " over " not in cg.texts["ir_post_fusion"]
    assert_close(cg.fn(*args)[0], f(*args)[0])


def test_graph_inputs_and_outputs_are_never_written_over() -> None:
    def f(a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.mm(a, w)
        return (t, t * 2 + a)
    args = (torch.randn(16, 16), torch.randn(16, 16))
    cg = compile_graph(trace(f, *args), list(args), options=OPTS)
    assert " over " not in cg.texts["ir_post_fusion"]
    a0 = args[0].clone()
    got = cg.fn(*args)
    assert torch.equal(args[0], a0)
    assert_close(got[1], f(*args)[1])


def test_view_indexing_through_div_mod_matches_the_flat_store_index() -> None:
    # ViT's GELU reads its matmul through a (B, L, C) view: 3072*(x0 % 197) + 605184*(x0 // 197) + x1
    # is the flat 3072*x0 + x1 it stores at, so the GELU may write over the matmul's output
    from kiln.inductor.ir import FloorDiv, ModIndex, index_var
    from kiln.inductor.scheduler.inplace import _canonical
    x0, x1 = index_var("x", 0), index_var("x", 1)
    viewed = x1 + 3072 * ModIndex(x0, 197) + 605184 * FloorDiv(x0, 197)
    assert _canonical(viewed) == _canonical(3072 * x0 + x1)
    assert _canonical(x1 + 3072 * ModIndex(x0, 196) + 605184 * FloorDiv(x0, 196)) != _canonical(3072 * x0 + x1)


def test_matmul_view_gelu_matmul_chain() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.addmm(b, x, w).view(6, 5, 16)
        return (torch.nn.functional.gelu(t).view(30, 16) @ w.t(),)
    args = (torch.randn(30, 8), torch.randn(8, 16), torch.randn(16))
    cg = compile_graph(trace(f, *args), list(args), options=OPTS)
    assert " over " in cg.texts["ir_post_fusion"]
    assert_close(cg.fn(*args)[0], f(*args)[0])


def test_activation_given_a_pooled_buffer_takes_its_dying_input_instead() -> None:
    # two MLP blocks: block 2's activation was given block 1's dead activation by the pool (held
    # from its death until then, across block 2's matmul); it takes its own matmul's memory instead
    # and block 1's activation is freed where it dies
    def f(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(torch.mm(x, w1) + 1.0)
        y = torch.mm(h, w2)
        h2 = torch.relu(torch.mm(y, w1) + 1.0)
        return (torch.mm(h2, w2),)
    args = (torch.randn(32, 16), torch.randn(16, 64), torch.randn(64, 16))
    cg = compile_graph(trace(f, *args), list(args), options=OPTS)
    text = cg.texts["ir_post_fusion"]
    assert text.count(" over ") == 2, text
    assert_close(cg.fn(*args)[0], f(*args)[0])
    one = 32 * 64 * 4
    eager, kiln = peak_bytes(f, *args), peak_bytes(cg.fn, *args)
    assert kiln <= eager and kiln < 2 * one, (kiln, eager)


def test_cross_compiled_cuda_gelu_writes_over_its_matmul() -> None:
    """The CUDA path (Triton, compiled for fake CUDA tensors): ViT's MLP GELU, read through a
    (B, L, C) view of the matmul's (B*L, C) output, takes that output's memory (an extern's layout
    says device 'cuda' where a kernel output's does not: the memory layout is what must match)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.addmm(b1, x.view(-1, 64), w1).view(4, 17, 256)
        return (torch.nn.functional.gelu(h).view(-1, 256) @ w2,)

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(4, 17, 64, dtype=torch.bfloat16, device="cuda"),
                torch.empty(64, 256, dtype=torch.bfloat16, device="cuda"),
                torch.empty(256, dtype=torch.bfloat16, device="cuda"),
                torch.empty(256, 64, dtype=torch.bfloat16, device="cuda")]
        cg = compile_graph(trace(mlp, *args), args, options=OPTS)
    assert " over " in cg.texts["ir_post_fusion"], cg.texts["ir_post_fusion"]
    assert "# written in place" in cg.texts["output_code"]
