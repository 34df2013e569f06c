"""Pass-level golden tests: index printing and iteration-space coalescing."""

import sympy
import torch

from kiln.inductor.codegen.triton.heuristics import TritonConfig, pointwise_blocks, row_blocks
from kiln.inductor.codegen.triton.printer import IndexPrinter, python_index
from kiln.inductor.codegen.triton.testing import kernel, node, xs
from kiln.inductor.codegen.triton.tiling import coalesce, simplify_kernel
from kiln.inductor.ir import FloorDiv, Load, ModIndex, index_var

x0, x1, x2 = xs(3)
s0 = sympy.Symbol("s0", integer=True, positive=True)


def test_index_printing():
    p = IndexPrinter()
    assert p(x0 * 16 + x1 + 3) == "16*x0 + x1 + 3"
    assert p(FloorDiv(x0, 4) * 8 + ModIndex(x1, 3)) == "8*(x0 // 4) + (x1 % 3)"
    assert p(s0 * x0 - 2 * x1 + 10) == "s0*x0 - 2*x1 + 10"
    assert p(sympy.Max(x0 - 1, sympy.Integer(0))) == "tl.maximum(0, x0 - 1)" or "tl.maximum" in p(
        sympy.Max(x0 - 1, sympy.Integer(0)))
    assert python_index(s0 * 128) == "128*s0"
    assert python_index(sympy.Max(s0, sympy.Integer(2))).startswith("max(")


def test_floordiv_mod_print_as_python_ints():
    e = FloorDiv(x0 + 5, 3) + ModIndex(x0, 7)
    code = IndexPrinter(triton=False)(e)
    for v in range(40):
        assert eval(code, {"x0": v}) == (v + 5) // 3 + v % 7


def test_coalesce_contiguous_dims_merge():
    sizes = [sympy.Integer(2), sympy.Integer(3), sympy.Integer(4)]
    idx = [12 * x0 + 4 * x1 + x2]
    new, mapping = coalesce(sizes, "x", idx)
    assert new == [24]
    assert sympy.expand(idx[0].xreplace(mapping)) == index_var("x", 0)


def test_coalesce_keeps_transposed_dims_and_drops_size_one():
    sizes = [sympy.Integer(4), sympy.Integer(1), sympy.Integer(5)]
    idx = [5 * x0 + x2, x0 + 4 * x2]  # one contiguous, one transposed read
    new, mapping = coalesce(sizes, "x", idx)
    assert new == [4, 5]
    assert mapping[x1] == 0


def test_simplify_kernel_rewrites_every_index():
    k = kernel("k", [2, 3], [], [node("out", Load("a", 3 * x0 + x1, torch.float32), 3 * x0 + x1)])
    s = simplify_kernel(k)
    assert s.outer == (6,)
    assert s.nodes[0].store_index == index_var("x", 0)
    assert s.nodes[0].body.index == index_var("x", 0)


def test_block_heuristics():
    cfg = TritonConfig()
    assert pointwise_blocks(sympy.Integer(10), cfg).xblock == 16
    assert pointwise_blocks(sympy.Integer(10**7), cfg).xblock == 1024
    assert pointwise_blocks(s0, cfg).xblock == 1024
    per = row_blocks(sympy.Integer(100), sympy.Integer(700), True, cfg)
    assert per.persistent and per.rblock == 1024
    loop = row_blocks(sympy.Integer(100), sympy.Integer(50000), True, cfg)
    assert not loop.persistent and loop.rblock <= 2048
    col = row_blocks(sympy.Integer(4096), sympy.Integer(50000), False, cfg)
    assert col.xblock >= 8 and 4096 // col.xblock >= 256
    sym = row_blocks(s0, s0, True, cfg)
    assert not sym.persistent
    # a symbolic column (LayerNorm's weight gradient over the tokens) is looped, its RBLOCK sized from
    # the example length as the static kernel's is
    static_col = row_blocks(sympy.Integer(768), sympy.Integer(4096), False, cfg)
    sym_col = row_blocks(sympy.Integer(768), s0, False, cfg, rhint=4096)
    assert not sym_col.persistent and (sym_col.xblock, sym_col.rblock) == (static_col.xblock, static_col.rblock)
