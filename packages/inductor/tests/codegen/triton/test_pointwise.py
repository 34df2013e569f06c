"""Pointwise kernels: chains, broadcasting, permuted/strided inputs, symbolic sizes, predicated loads."""

import pytest
import sympy
import torch

from kiln.inductor.codegen.triton import (
    TritonKernels,
    generate_kernel,
    launch_statement,
    wrapper_prologue,
)
from kiln.inductor.codegen.triton.testing import device, kernel, load, node, run, strided, xs
from kiln.inductor.ir import Constant, IndexValue, Load, cast, op

F32 = torch.float32


def test_contiguous_chain_coalesces_to_one_index():
    dev = device()
    a = torch.randn(2, 3, 4, 5, device=dev)
    v = xs(4)
    la = load("a", v, a)
    body = op("mul", op("sigmoid", la, dtype=F32), op("add", la, Constant(1.0, F32), dtype=F32), dtype=F32)
    out = torch.empty_like(a)
    tk = run([kernel("k_chain", a.shape, [], [node("out", body, strided(v, out))])], {"a": a, "out": out})
    src = tk.generated[0].source
    assert "x0 = xindex\n" in src and "//" not in src and "%" not in src, src
    torch.testing.assert_close(out, torch.sigmoid(a) * (a + 1))


def test_broadcast_and_permuted_strided_inputs():
    dev = device()
    a = torch.randn(6, 5, 4, device=dev).permute(2, 0, 1)  # (4, 6, 5), non-contiguous
    b = torch.randn(6, 1, device=dev).expand(6, 5)  # stride 0 along the last dim
    c = torch.randn(40, device=dev)[::2][:5]  # strided with an offset-free step
    v = xs(3)
    body = op("add", op("mul", load("a", v, a), load("b", v[1:], b), dtype=F32), load("c", v[2:], c), dtype=F32)
    out = torch.empty(4, 6, 5, device=dev)
    run([kernel("k_bcast", [4, 6, 5], [], [node("out", body, strided(v, out))])],
        {"a": a, "b": b, "c": c, "out": out})
    torch.testing.assert_close(out, a * b + c)


def test_storage_offset_view_input():
    """Kernels index from the tensor's data pointer; a view's offset is part of its index here."""
    dev = device()
    base = torch.randn(10, 8, device=dev)
    (x0, x1) = xs(2)
    la = Load("base", strided([x0 + 2, x1], base), F32)  # rows 2.. of base
    out = torch.empty(5, 8, device=dev)
    run([kernel("k_off", [5, 8], [], [node("out", op("neg", la, dtype=F32), strided([x0, x1], out))])],
        {"base": base, "out": out})
    torch.testing.assert_close(out, -base[2:7])


def test_symbolic_sizes_are_kernel_arguments():
    dev = device()
    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    x0, x1 = xs(2)
    idx = x0 * s1 + x1
    body = op("add", op("exp", Load("a", idx, F32), dtype=F32), Load("b", x1, F32), dtype=F32)
    k = kernel("k_sym", [s0, s1], [], [node("out", body, idx)])
    g = generate_kernel(k)
    assert g.size_args == ("s0", "s1") and g.xnumel == "s0*s1"
    # sizes: i64 and never specialised on (one binary for every size, compiled ahead)
    assert g.source.startswith("@triton.jit(do_not_specialize=['s0', 's1'])\n")
    assert 's0: "i64", s1: "i64", XBLOCK' in g.source and "tl.program_id(0).to(tl.int64)" in g.source
    tk = TritonKernels([k])
    for n, m in ((3, 7), (5, 130)):
        a = torch.randn(n, m, device=dev)
        b = torch.randn(m, device=dev)
        out = torch.empty(n, m, device=dev)
        tk.run({"a": a, "b": b, "out": out}, {"s0": n, "s1": m})
        torch.testing.assert_close(out, a.exp() + b)


def test_where_branches_never_load_out_of_range():
    """cat as a where-chain: each branch's load is masked by its predicate."""
    dev = device()
    a, b = torch.randn(3, device=dev), torch.randn(4, device=dev)
    (x0,) = xs(1)
    cond = op("lt", IndexValue(x0, torch.int64), Constant(3, torch.int64), dtype=torch.bool)
    body = op("where", cond, Load("a", x0, F32), Load("b", x0 - 3, F32), dtype=F32)
    out = torch.empty(7, device=dev)
    tk = run([kernel("k_cat", [7], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    src = tk.generated[0].source
    assert "xmask & tmp" in src and "(~tmp" in src, src  # the else branch loads under the negated test
    torch.testing.assert_close(out, torch.cat([a, b]))


def test_scalar_kernel_and_constant_store():
    dev = device()
    out = torch.empty((), device=dev)
    full = torch.empty(3, 2, dtype=torch.int64, device=dev)
    x0, x1 = xs(2)
    run([kernel("k_scalar", [], [], [node("out", Constant(2.5, F32), sympy.Integer(0))]),
         kernel("k_fill", [3, 2], [], [node("full", Constant(7, torch.int64), strided([x0, x1], full))])],
        {"out": out, "full": full})
    assert float(out) == 2.5 and torch.equal(full, torch.full((3, 2), 7, device=dev))


def test_horizontal_fusion_two_outputs_and_bool_store():
    dev = device()
    a = torch.randn(33, device=dev)
    (x0,) = xs(1)
    la = load("a", [x0], a)
    pos = torch.empty(33, dtype=torch.bool, device=dev)
    dbl = torch.empty(33, dtype=torch.float16, device=dev)
    run([kernel("k_two", [33], [], [
        node("pos", op("gt", la, Constant(0.0, F32), dtype=torch.bool), x0),
        node("dbl", cast(op("mul", la, Constant(2.0, F32), dtype=F32), torch.float16), x0),
    ])], {"a": a, "pos": pos, "dbl": dbl})
    assert torch.equal(pos, a > 0)
    torch.testing.assert_close(dbl, (a * 2).half())


def test_wrapper_prologue_and_launch_statement_run():
    """The text a wrapper embeds: exec it, then run the launch statement with buffers as variables."""
    dev = device()
    (x0,) = xs(1)
    k = kernel("k_wrap", [10], [], [node("out", op("square", Load("a", x0, F32), dtype=F32), x0)])
    g = generate_kernel(k)
    ns: dict = {}
    exec(compile(wrapper_prologue([g]), "<wrapper>", "exec"), ns)
    a = torch.randn(10, device=dev)
    ns.update(a=a, out=torch.empty(10, device=dev))
    exec(launch_statement(g), ns)
    torch.testing.assert_close(ns["out"], a * a)


@pytest.mark.parametrize("n", [1, 17, 4096 + 3])
def test_block_sizes_cover_any_length(n):
    dev = device()
    a = torch.randn(n, device=dev)
    (x0,) = xs(1)
    out = torch.empty(n, device=dev)
    tk = run([kernel("k_len", [n], [], [node("out", op("abs", Load("a", x0, F32), dtype=F32), x0)])],
             {"a": a, "out": out})
    g = tk.generated[0]
    assert g.xblock & (g.xblock - 1) == 0 and 1 <= g.num_warps <= 8
    torch.testing.assert_close(out, a.abs())


@pytest.mark.parametrize("shape", [(40, 70), (16, 3, 33)])
def test_transpose_gets_a_2d_tile(shape):
    """out (contiguous) = a.T-like read: loads walk memory along another dim than stores -> 2-D tiles."""
    dev = device()
    a = torch.randn(*reversed(shape), device=dev)
    v = xs(len(shape))
    at = a.permute(*reversed(range(len(shape))))
    out = torch.empty(shape, device=dev)
    body = op("add", load("a", v, at), Constant(1.0, F32), dtype=F32)
    tk = run([kernel("k_t", shape, [], [node("out", body, strided(v, out))])], {"a": a, "out": out})
    g = tk.generated[0]
    assert g.kind == "pointwise_2d" and g.yblock > 1 and "YBLOCK" in g.source, g.source
    torch.testing.assert_close(out, at + 1)


def test_a_big_transposing_kernel_gets_a_smaller_tile():
    """A 2-D kernel with many loads and stores (Llama's fused residual recompute: 143 loads, 71
    stores) keeps every live value's tile in registers: 32 x 32 (8 elements a thread), not the
    64 x 64 a small transpose gets (which spilled and took triton 12-16 s to compile)."""
    dev = device()
    shape = (64, 80)
    v = xs(2)
    a = torch.randn(*reversed(shape), device=dev)
    at = a.t()
    rows = torch.randn(shape[0], device=dev)
    acc = load("a", v, at)
    nodes, outs, expect, ref = [], {}, [], at.clone()
    for i in range(10):  # a chain; each step reads a per-row value and stores its own output
        acc = op("add", acc, op("mul", load("rows", v[:1], rows), Constant(float(i), F32), dtype=F32), dtype=F32)
        outs[f"o{i}"] = torch.empty(shape, device=dev)
        nodes.append(node(f"o{i}", acc, strided(v, outs[f"o{i}"])))
        ref = ref + rows[:, None] * float(i)
        expect.append(ref)
    tk = run([kernel("k_big", shape, [], nodes)], {"a": a, "rows": rows, **outs})
    g = tk.generated[0]
    assert g.kind == "pointwise_2d" and g.xblock * g.yblock == 1024 and g.num_warps == 4, (g.xblock, g.yblock)
    for i, want in enumerate(expect):
        torch.testing.assert_close(outs[f"o{i}"], want)
    small = run([kernel("k_small", shape, [], nodes[:1])], {"a": a, "rows": rows, "o0": outs["o0"]}).generated[0]
    assert small.kind == "pointwise_2d" and (small.xblock, small.yblock) == (64, 64)
