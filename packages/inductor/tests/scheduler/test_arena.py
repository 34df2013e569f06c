"""The per-call arena (scheduler/arena.py, ``InductorOptions.memory_arena``): results equal eager's,
storages alive at the same step never share bytes, every use of a buffer lies in its storage's span,
and the arena is no larger than the program's own planned peak."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import check, compile_fn, transformer_blocks
from torch._subclasses.fake_tensor import FakeTensorMode
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph, planned_peak
from kiln.inductor.graph_passes.pad_matmuls import MM_PADDED_SOURCE
from kiln.inductor.ir import ExternKernel, work_buffers
from kiln.inductor.scheduler.arena import ALIGN, plan_arena
from kiln.runtime.program_helpers import conv_out

ARENA = InductorOptions(strict_lowering=True, memory_arena=True)
needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need a GPU or TRITON_INTERPRET=1")


def _mlp(x, w1, b1, w2, b2, w3):
    h = F.gelu(F.linear(x, w1, b1))
    h = F.layer_norm(F.linear(h, w2, b2) + h, h.shape[-1:])
    return (torch.relu(h @ w3),)


def _intermediate_returned(x, w):
    # an output that is a view of an intermediate, and one that is not: both stay out of the arena
    h = torch.relu(x @ w)
    y = torch.sigmoid(h) * 2.0
    return (y @ w.t(), h.t())


def _pointwise_chain(x):
    # kernels written over their dying inputs (Kernel.inplace): one storage through the chain
    a = torch.exp(x * 0.5)
    b = torch.tanh(a) + a
    c = (b @ b.t()).softmax(-1)
    return (c * 3.0 + 1.0,)


def _batched(q, k, v):
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125
    p = torch.softmax(s, -1)
    return (torch.bmm(p, v).sum(1),)


def _logits(x, w1, w2, head):
    # a large output made last, after a smaller peak: the arena takes it in (outputs are most of it)
    return ((torch.relu(x @ w1) @ w2) @ head,)


def _mutating(x, w):
    h = x @ w
    h.add_(1.0)  # an in-place ATen op on an intermediate: its storage escapes the plan
    return (torch.relu(h).sum(0),)


def _cases() -> dict[str, tuple[Any, tuple]]:
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g) * 0.3
    return {
        "mlp": (_mlp, (r(16, 32), r(64, 32), r(64), r(64, 64), r(64), r(64, 48))),
        "transformer": (transformer_blocks(2), (r(8, 32), *[t for _ in range(2)
                                                            for t in (r(64, 32), r(64), r(32, 64), r(32))])),
        "intermediate_returned": (_intermediate_returned, (r(24, 16), r(16, 16))),
        "pointwise_chain": (_pointwise_chain, (r(32, 32),)),
        "batched": (_batched, (r(4, 8, 16), r(4, 8, 16), r(4, 8, 16))),
        "logits": (_logits, (r(8, 16), r(16, 1024), r(1024, 64), r(64, 8192))),
        "mutating": (_mutating, (r(16, 16), r(16, 16))),
    }


CASES = _cases()


@pytest.mark.parametrize("backend", ["cpp", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_results_equal_eager_with_the_arena(name: str, backend: str) -> None:
    fn, args = CASES[name]
    cg = check(fn, *args, options=ARENA.replace(cpu_backend=backend))
    placed = bool(plan_arena(cg.scheduled).offsets)  # type: ignore[attr-defined]
    assert ("_arena = torch.empty" in cg.texts["output_code"]) == placed
    assert placed == (name != "mutating")  # there the one intermediate escapes through add_


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_keeps_live_storages_apart(name: str) -> None:
    fn, args = CASES[name]
    cg = compile_fn(fn, *args)
    s = cg.scheduled  # type: ignore[attr-defined]
    plan = plan_arena(s)
    for k, st in enumerate(s.steps):
        named = work_buffers(st.work) + ([o.buffer for o in st.work.outputs] if isinstance(st.work, ExternKernel) else [])
        for b in named:
            if b in plan.roots:
                lo, hi, _ = plan.spans[plan.roots[b]]
                assert lo <= k <= hi, (b, k, lo, hi)
    spans = list(plan.spans.items())
    for i, (r1, (s1, e1, n1)) in enumerate(spans):
        assert plan.offsets[r1] % ALIGN == 0 and plan.offsets[r1] + n1 <= plan.size
        for r2, (s2, e2, n2) in spans[i + 1:]:
            if s1 <= e2 and s2 <= e1:  # alive at the same step: disjoint bytes
                o1, o2 = plan.offsets[r1], plan.offsets[r2]
                assert o1 + n1 <= o2 or o2 + n2 <= o1, (r1, r2)
    assert plan.live_peak <= plan.size <= 1.25 * plan.live_peak + ALIGN
    # never more than the memory plan's own peak (hand-overs are planned anew, so often less)
    assert plan.live_peak <= planned_peak(s).peak + len(plan.offsets) * ALIGN


def test_outputs_join_the_arena_only_when_they_are_most_of_it() -> None:
    fn, args = CASES["logits"]
    plan = plan_arena(compile_fn(fn, *args).scheduled)  # type: ignore[attr-defined]
    out = compile_fn(fn, *args).scheduled.program.outputs[0].buffer  # type: ignore[attr-defined]
    assert out in plan.roots
    fn, args = CASES["mlp"]
    s = compile_fn(fn, *args).scheduled  # type: ignore[attr-defined]
    plan = plan_arena(s)
    assert s.program.outputs[0].buffer not in plan.roots


def test_an_in_place_aten_op_keeps_its_argument_out_of_the_arena() -> None:
    fn, args = CASES["mutating"]
    s = compile_fn(fn, *args, options=InductorOptions()).scheduled  # type: ignore[attr-defined]
    inplace = [st.work for st in s.steps if isinstance(st.work, ExternKernel) and st.work.target.startswith("aten.add_")]
    assert inplace, "add_ no longer reaches the wrapper as an in-place call: the case covers nothing"
    plan = plan_arena(s)
    for e in inplace:
        for a in e.args:
            assert getattr(a, "buffer", None) not in plan.roots


def test_cuda_conv_net_writes_convolutions_into_the_arena() -> None:
    """Cross-compiled for CUDA (fake tensors): the convolutions go through ``conv_out``."""
    def net(x, w1, w2, b2, w3):
        h = torch.relu(F.conv2d(x, w1, padding=1))
        h = torch.relu(F.conv2d(h, w2, b2, padding=1, groups=16))  # depthwise, with a bias
        return (F.conv2d(h, w3).mean((2, 3)),)
    shapes = [(2, 3, 16, 16), (16, 3, 3, 3), (16, 1, 3, 3), (16,), (8, 16, 1, 1)]
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(s, device="cuda") for s in shapes]
        with torch.backends.cudnn.flags(enabled=False):
            gm = trace(net, *args)
        cg = compile_graph(gm, args, options=ARENA)
    src = cg.texts["output_code"]
    assert src.count("_conv_out(") >= 2 and "_arena = torch.empty" in src, src


def test_conv_out_off_cudnn_returns_the_plain_result() -> None:
    x, w, b = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), torch.randn(6)
    slot = torch.empty(2, 6, 8, 8)
    got = conv_out(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, slot)
    torch.testing.assert_close(got, F.conv2d(x, w, b, padding=1))


def test_padded_matmul_writes_into_given_memory() -> None:
    ns: dict[str, Any] = {"torch": torch}
    exec(MM_PADDED_SOURCE, ns)
    a, b, bias = torch.randn(40, 24), torch.randn(24, 37), torch.randn(37)
    out = torch.full((40, 37), float("nan"))
    got = ns["_mm_padded"](bias, a, b, 40, 16, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, torch.addmm(bias, a, b))
