"""Pass-level checks of symbolic sizes in the loop IR, the scheduler and the memory plan."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from dynamic_helpers import BACKENDS, check_sizes, compile_symbolic, symbolic_graph

from kiln.inductor import DynamicShapeUnsupported, compile_graph
from kiln.inductor.ir import ExternKernel, product

W = [torch.randn(16, 16) * 0.3 for _ in range(4)]


def chain(x, a, b, c, d):
    h = F.relu(x @ a)
    h = F.relu(h @ b)
    wide = torch.cat([h, h], 0)  # 2*s rows: another size, never handed a (s, 16) buffer
    h = F.relu(h @ c)
    return (F.relu(h @ d), wide.sum(1))


def test_program_text_names_sizes_and_their_sources():
    cg = compile_symbolic(chain, torch.randn(37, 16), *W, dynamic={0: (0,)})
    text = cg.loop_program.as_text()  # type: ignore[attr-defined]
    sym = cg.loop_program.sizes[0].symbol  # type: ignore[attr-defined]
    assert f"{sym} = arg0.size(0)  # size (example: 37)" in text
    assert f"float32[{sym}, 16]" in text


def test_memory_plan_reuses_only_provably_equal_sizes():
    cg = compile_symbolic(chain, torch.randn(37, 16), *W, dynamic={0: (0,)})
    sched = cg.scheduled  # type: ignore[attr-defined]
    layouts = sched.program.layouts()
    reuses = [(a.layout, layouts[a.reuse]) for st in sched.steps for a in st.allocate if a.reuse]
    assert reuses, sched.as_text()
    for new, old in reuses:
        assert new.dtype == old.dtype
        assert sympy.expand(product(new.shape) - product(old.shape)) == 0
    for n in (1, 2, 9, 0):  # the plan holds for every size
        x = torch.randn(n, 16)
        got = cg.fn(x, *W)
        for g, w in zip(got, chain(x, *W)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_kernels_take_sizes_as_arguments():
    cg = compile_symbolic(lambda x: (x.softmax(-1),), torch.randn(37, 41))
    src = cg.texts["output_code"]
    syms = [z.symbol for z in cg.loop_program.sizes]  # type: ignore[attr-defined]
    assert all(f"const int64_t {s}" in src for s in syms), src
    assert "< 41" not in src and "< 37" not in src  # no loop bound from the example sizes


def test_unbacked_sizes_are_refused_clearly():
    """A data-dependent size (nonzero) has no input to read it from: a clear error, not a wrong result."""
    gm, examples = symbolic_graph(lambda x: (torch.nonzero(x > 0).float().sum(0),), torch.randn(37, 3))
    with pytest.raises(DynamicShapeUnsupported, match="data-dependent size"):
        compile_graph(gm, examples)


def test_outputs_keep_traced_dense_strides_and_refuse_gapped_ones():
    """Outputs come back with the traced strides (a transposed result stays transposed), which is what
    a caller reading them with the traced layout (a backward's saved activations) needs; a lazy view with
    gaps, which no returned buffer could match for every size, is refused."""
    cg = compile_symbolic(lambda x: ((x * 2).t(), x.sum(1)), torch.randn(37, 5))
    for n in (1, 4, 9):
        x = torch.randn(n, 5)
        got = cg.fn(x)[0]
        assert got.stride() == (x * 2).t().stride()
        torch.testing.assert_close(got, (x * 2).t())
    gm, examples = symbolic_graph(lambda x: ((x * 2)[:, :3],), torch.randn(37, 5))
    with pytest.raises(DynamicShapeUnsupported, match="neither dense nor broadcast"):
        compile_graph(gm, examples)


def _rotary(x, cos, w):
    """Llama's attention prologue: a projected query viewed per head and transposed, rotated by a
    position table; the result is attention's operand and a graph output (an activation the backward
    reads) at once."""
    q = (x @ w).view(x.shape[0], x.shape[1], 4, 8).transpose(1, 2)
    c = cos.unsqueeze(1)
    rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
    o = q * c.cos() + rotated * c.sin()
    for _ in range(2):  # a body too large to recompute for each consumer: realized once
        o = torch.tanh(o * c + q) - o.sin()
    return o, F.scaled_dot_product_attention(o, o, o)


def test_output_realized_early_keeps_its_traced_transposed_layout():
    """A transposed output with an expensive body, realized for attention before the output is met, is
    stored in its traced (dense, transposed) layout: returned with those strides for every size, not
    refused (Llama's training step ran its forward graph through ATen)."""
    def make(n):
        return torch.randn(2, n, 32), torch.randn(1, n, 8), torch.randn(32, 32) * 0.2
    cg = compile_symbolic(_rotary, *make(9), dynamic={0: (1,), 1: (1,)})
    check_sizes(cg, _rotary, make, (1, 2, 5, 17))
    for n in (3, 11):
        args = make(n)
        assert cg.fn(*args)[0].stride() == _rotary(*args)[0].stride()


@pytest.mark.parametrize("options", BACKENDS)
def test_slice_scatter_over_a_symbolic_dim(options):
    """T5's shift_right and the backward of a slice (``x[:, 1:]``) over a symbolic length: generated,
    not an ATen fallback."""
    def fn(x, y):
        shifted = torch.slice_scatter(torch.zeros_like(x), x[:, :-1] * 2, 1, 1)
        return shifted, torch.slice_scatter(x, y.exp(), 1, 0, y.shape[1]), torch.slice_scatter(x, x[:, ::2], 1, 0,
                                                                                                 None, 2)
    cg = compile_symbolic(fn, torch.randn(3, 9), torch.randn(3, 9), options=options)
    assert not [n.target for n in cg.loop_program.nodes if isinstance(n, ExternKernel)]
    check_sizes(cg, fn, lambda n: (torch.randn(3, n), torch.randn(3, n)), (1, 2, 5, 8, 13))
