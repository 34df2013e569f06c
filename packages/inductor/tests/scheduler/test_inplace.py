"""Mutated inputs written in place by the pointwise kernel computing them (scheduler/inplace.py), on the C++
backend and on Triton (the interpreter here), where only the kernel's node computing the new value may read
the input."""

from __future__ import annotations

import torch
from torch import fx
from tracer import trace

import kiln
from kiln.graph import GraphAnnotations, annotate
from kiln.inductor import InductorOptions, compile_graph

aten = torch.ops.aten


def _graph(extra: str) -> fx.GraphModule:
    """new_p = p - 0.1 * g (output 0, marked as the new value of input 0), plus one more output."""
    g = fx.Graph()
    p, grad = g.placeholder("p"), g.placeholder("g")
    new = g.call_function(aten.sub.Tensor, (p, g.call_function(aten.mul.Tensor, (grad, 0.1))))
    if extra == "later_reader":  # a matmul of the new and the old p: it runs after the update
        other = g.call_function(aten.mm.default, (new, p))
    elif extra == "other_index":  # reads p at another element than the one it writes
        new = g.call_function(aten.add.Tensor, (new, g.call_function(aten.flip.default, (p, [0]))))
        other = g.call_function(aten.sum.default, (grad,))
    elif extra == "returned":  # the old p itself is an output too
        other = p
    else:
        other = g.call_function(aten.sum.default, (grad,))
    g.output((other, new))
    gm = fx.GraphModule({}, g)
    annotate(gm, GraphAnnotations(input_mutations=((1, 0),)))  # output 1 is the new value of input 0
    return gm


def _eager(extra: str, p: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    new = p - grad * 0.1
    if extra == "later_reader":
        return new @ p, new
    if extra == "other_index":
        return grad.sum(), new + p.flip(0)
    if extra == "returned":
        return p.clone(), new
    return grad.sum(), new


def _run(extra: str) -> tuple[bool, str]:
    torch.manual_seed(0)
    p, grad = torch.randn(20, 20), torch.randn(20, 20)
    want = _eager(extra, p, grad)
    compiled = compile_graph(_graph(extra), [p, grad])
    p_before = p.clone()
    other, new = compiled.fn(p, grad)
    in_place = new.data_ptr() == p.data_ptr()
    torch.testing.assert_close(new, want[1])
    torch.testing.assert_close(other, want[0])
    if not in_place:
        torch.testing.assert_close(p, p_before)  # the functional contract: p untouched
    return in_place, compiled.texts["output_code"] + compiled.texts["ir_post_fusion"]


def test_pointwise_update_writes_into_its_input() -> None:
    in_place, code = _run("plain")
    assert in_place
    # bound to the input, not allocated (the wrapper names it arg0 from there on: "buf1 is arg0")
    assert " over arg0" in code and "buf1 is arg0" in code and "buf1 = torch.empty_strided" not in code


def test_input_read_by_a_later_kernel_is_not_overwritten() -> None:
    assert not _run("later_reader")[0]


def test_input_read_at_another_index_is_not_overwritten() -> None:
    assert not _run("other_index")[0]


def test_input_that_is_also_returned_is_not_overwritten() -> None:
    assert not _run("returned")[0]


def _adam(params, grads, exp_avgs, exp_avg_sqs) -> None:
    lr, beta1, beta2, eps, step = 1e-3, 0.9, 0.999, 1e-8, 3
    bias1, bias2 = 1 - beta1**step, 1 - beta2**step
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(m, (v / bias2).sqrt().add_(eps), value=-lr / bias1)


def test_adam_step_over_many_tensors_matches_eager_and_mutates_in_place() -> None:
    torch.manual_seed(0)
    shapes = [(37,), (16, 9), (5, 3, 7), (1,), (64, 33)]
    state = [[torch.randn(s) for s in shapes] for _ in range(3)] + [[torch.rand(s) for s in shapes]]
    ref = [[t.clone() for t in ts] for ts in state]
    ptrs = [t.data_ptr() for ts in state for t in ts]
    step = kiln.compile(_adam, backend="inductor")
    for _ in range(3):  # the same memory is updated each call, as eager's loop does
        step(*state)
        _adam(*ref)
    for got, want in zip(state, ref):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [t.data_ptr() for ts in state for t in ts] == ptrs


def _adam_foreach(params, grads, exp_avgs, exp_avg_sqs) -> None:
    with torch.no_grad():
        torch._foreach_mul_(exp_avgs, 0.9)
        torch._foreach_add_(exp_avgs, grads, alpha=0.1)
        torch._foreach_mul_(exp_avg_sqs, 0.999)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=0.001)
        denom = torch._foreach_sqrt(torch._foreach_div(exp_avg_sqs, 0.5))
        torch._foreach_add_(denom, 1e-8)
        torch._foreach_addcdiv_(params, exp_avgs, denom, value=-0.01)


def test_foreach_adam_step_matches_eager_with_every_state_updated_in_place() -> None:
    torch.manual_seed(0)
    shapes = [(37,), (16, 9), (5, 3, 7), (1,), (64, 33)]
    state = [[torch.randn(s) for s in shapes] for _ in range(3)] + [[torch.rand(s) for s in shapes]]
    ref = [[t.clone() for t in ts] for ts in state]
    step = kiln.compile(_adam_foreach, backend="inductor")
    for _ in range(2):
        step(*state)
        _adam_foreach(*ref)
    for got, want in zip(state, ref):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _functional_adam(p, g, m, v):
    m2 = m * 0.9 + g * 0.1
    v2 = v * 0.999 + g * g * 0.001
    return p - 0.01 * m2 / ((v2 / 0.5).sqrt() + 1e-8), m2, v2


def test_the_update_kernel_of_each_tensor_writes_all_three_states_in_place() -> None:
    torch.manual_seed(0)
    p, g, m, v = torch.randn(16, 9), torch.randn(16, 9), torch.randn(16, 9), torch.rand(16, 9)
    gm = trace(_functional_adam, p, g, m, v)
    annotate(gm, GraphAnnotations(input_mutations=((0, 0), (1, 2), (2, 3))))  # new p, m, v are inputs 0, 2, 3
    want = _functional_adam(p, g, m, v)
    cg = compile_graph(gm, [p, g, m, v])
    got = cg.fn(p, g, m, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert cg.texts["ir_post_fusion"].count(" over arg") == 3  # one kernel writes p, m and v in place
    assert [o.data_ptr() for o in got] == [t.data_ptr() for t in (p, m, v)]


TRITON = InductorOptions(cpu_backend="triton")


def test_triton_update_kernel_writes_all_three_states_in_place_over_repeated_steps() -> None:
    # the fused p/m/v kernel reads the new m and v in registers: each input has one reader, its own update
    torch.manual_seed(0)
    p, g, m, v = torch.randn(16, 9), torch.randn(16, 9), torch.randn(16, 9), torch.rand(16, 9)
    gm = trace(_functional_adam, p, g, m, v)
    annotate(gm, GraphAnnotations(input_mutations=((0, 0), (1, 2), (2, 3))))
    cg = compile_graph(gm, [p, g, m, v], options=TRITON)
    assert cg.texts["ir_post_fusion"].count(" over arg") == 3
    for step in range(3):  # fresh gradients; the states carried over in their own memory, as eager's loop
        g = torch.randn(16, 9)
        want = _functional_adam(p, g, m, v)
        got = cg.fn(p, g, m, v)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        assert [o.data_ptr() for o in got] == [t.data_ptr() for t in (p, m, v)], step


def test_triton_input_read_by_another_node_of_its_kernel_is_not_overwritten() -> None:
    # new = p * 2 is written where p is; another output of the same kernel reads the old p at that element
    def f(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return p * 2, p + q

    p, q = torch.randn(64), torch.randn(64)
    gm = trace(f, p, q)
    annotate(gm, GraphAnnotations(input_mutations=((0, 0),)))
    cg = compile_graph(gm, [p, q], options=TRITON)
    assert " over arg" not in cg.texts["ir_post_fusion"]
    for _ in range(2):
        p, q = torch.randn(64), torch.randn(64)
        want = f(p, q)
        for a, b in zip(cg.fn(p, q), want):
            torch.testing.assert_close(a, b)
