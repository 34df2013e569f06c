"""The loop IR as data: frozen, hashable, printable; index algebra; the verifier."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

from kiln.graph import VerificationError
from kiln.inductor import ir


def _program(body: ir.Expr, name: str = "buf0") -> ir.LoopProgram:
    x = ir.InputBuffer("arg0", ir.Layout.contiguous((sympy.Integer(4), sympy.Integer(8)), torch.float32), 0)
    node = ir.ComputedBuffer(name, x.layout, ir.Pointwise(x.layout.shape, body), ("sin",))
    return ir.LoopProgram("g", (x,), (node,), (ir.TensorRef(name, x.layout.shape, x.layout.stride, sympy.Integer(0),
                                                              torch.float32),))


def test_exprs_are_frozen_hashable_and_print() -> None:
    i0, i1 = ir.index_vars("i", 2)
    a = ir.op("sin", ir.Load("arg0", 8 * i0 + i1, torch.float32), dtype=torch.float32)
    b = ir.op("sin", ir.Load("arg0", 8 * i0 + i1, torch.float32), dtype=torch.float32)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "cos"  # type: ignore[misc]
    assert ir.format_expr(a) == "sin(arg0[8*i0 + i1])"
    assert len({a, b}) == 1


def test_program_golden_text() -> None:
    i0, i1 = ir.index_vars("i", 2)
    body = ir.op("add", ir.op("sin", ir.Load("arg0", 8 * i0 + i1, torch.float32), dtype=torch.float32),
                 ir.Constant(1.0, torch.float32), dtype=torch.float32)
    assert _program(body).as_text() == (
        "# loop program g\n"
        "arg0: float32[4, 8](8, 1) = input 0\n"
        "buf0: float32[4, 8](8, 1) = pointwise[4, 8] add(sin(arg0[8*i0 + i1]), 1.0)\n"
        "return (buf0.view([4, 8], (8, 1), +0))")


def test_substitute_folds_a_view_into_the_index() -> None:
    i0, i1 = ir.index_vars("i", 2)
    load = ir.Load("arg0", 8 * i0 + i1, torch.float32)
    transposed = ir.substitute_index(load, {i0: i1, i1: i0})  # simultaneous swap
    assert transposed == ir.Load("arg0", 8 * i1 + i0, torch.float32)


def test_floordiv_and_mod_simplify() -> None:
    i0, i1 = ir.index_vars("i", 2)
    assert ir.FloorDiv(8 * i0 + 16, 8) == i0 + 2
    assert ir.ModIndex(8 * i0 + i1, 8) == ir.ModIndex(i1, 8)
    assert ir.FloorDiv(ir.FloorDiv(i0, 2), 3) == ir.FloorDiv(i0, 6)
    assert ir.FloorDiv(sympy.Integer(17), 5) == 3 and ir.ModIndex(sympy.Integer(17), 5) == 2


def test_verifier_accepts_good_and_names_bad_programs() -> None:
    i0, i1 = ir.index_vars("i", 2)
    good = ir.op("sin", ir.Load("arg0", 8 * i0 + i1, torch.float32), dtype=torch.float32)
    ir.verify_program(_program(good))
    with pytest.raises(VerificationError, match="unknown op"):
        ir.verify_program(_program(ir.Op("frobnicate", (good,), torch.float32)))
    with pytest.raises(VerificationError, match="before it is defined"):
        ir.verify_program(_program(ir.Load("nope", i0, torch.float32)))
    r0 = ir.index_var("r", 0)
    with pytest.raises(VerificationError, match="allowed loop vars"):
        ir.verify_program(_program(ir.Load("arg0", r0, torch.float32)))
    with pytest.raises(VerificationError, match="takes 2 operands"):
        ir.verify_program(_program(ir.Op("add", (good,), torch.float32)))
    with pytest.raises(VerificationError, match="holds"):
        ir.verify_program(_program(ir.Load("arg0", i0, torch.float64)))


def test_every_op_has_a_cpp_implementation() -> None:
    from kiln.inductor.codegen.cpp.exprs import op_call
    for name, info in ir.OPS.items():
        args = [ir.Constant(1.0, torch.float32)] * info.arity
        text = op_call(ir.Op(name, tuple(args), torch.float32), ["a"] * info.arity)
        assert text, name


def test_substitute_index_is_simultaneous_and_its_cache_keys_on_all_inputs() -> None:
    import sympy

    from kiln.inductor.ir import Load, substitute_index
    from kiln.inductor.ir.expr import substituted

    i0, i1 = sympy.symbols("i0 i1", integer=True)
    ld = Load("buf0", 8 * i0 + i1, torch.float32)
    swapped = substitute_index(ld, {i0: i1, i1: i0})
    assert swapped.index == 8 * i1 + i0  # a swap, not i0 -> i1 -> i0
    again = substitute_index(ld, {i0: i1, i1: i0})
    assert again.index == swapped.index
    # another mapping, another index over the same symbols: each gets its own (fresh) result
    assert substitute_index(ld, {i0: i1 + 1}).index == 8 * i1 + i1 + 8
    assert substitute_index(Load("buf0", 4 * i0 + i1, torch.float32), {i0: i1, i1: i0}).index == 4 * i1 + i0
    assert substituted(8 * i0 + i1, ((i0, 2 * i1),)) == 17 * i1
    assert substituted(8 * i0 + i1, ((i0, 3 * i1),)) == 25 * i1


def _random_shared_body(rng) -> ir.Expr:
    """A body whose subtrees are shared objects (as inlined lazy values make them)."""
    pool: list = [ir.Load(f"b{rng.randrange(5)}", sympy.Symbol(f"i{rng.randrange(3)}") * rng.randrange(1, 3),
                          torch.float32) for _ in range(4)]
    pool.append(ir.Constant(1.0, torch.float32))
    for _ in range(rng.randrange(1, 12)):
        k = rng.random()
        if k < 0.6:
            pool.append(ir.Op("add", (rng.choice(pool), rng.choice(pool)), torch.float32))
        elif k < 0.8:
            pool.append(ir.Cast(rng.choice(pool), torch.float16))
        else:
            pool.append(ir.Load("g", sympy.Symbol("d0"), torch.float32, (rng.choice(pool),)))
    return pool[-1]


def test_reads_lists_loads_in_first_occurrence_order_of_the_full_tree() -> None:
    """reads() skips a shared subtree met again; the answer is the per-occurrence walk's."""
    import random

    from kiln.inductor.ir.expr import walk

    rng = random.Random(0)
    for _ in range(500):
        e = _random_shared_body(rng)
        expected = list(dict.fromkeys(n for n in walk(e) if isinstance(n, ir.Load)))
        assert ir.reads(e) == expected


def test_substitute_index_keeps_untouched_subtrees_and_rebuilds_changed_ones() -> None:
    i0, i1 = sympy.symbols("i0 i1", integer=True)
    a = ir.Load("a", i0, torch.float32)
    b = ir.Load("b", 2 * i1, torch.float32)
    untouched = ir.Op("neg", (b,), torch.float32)
    e = ir.Op("add", (a, untouched), torch.float32)
    out = ir.substitute_index(e, {i0: i0 + 1})
    assert out.args[1] is untouched  # nothing in it uses i0
    assert out.args[0] == ir.Load("a", i0 + 1, torch.float32)
    assert ir.substitute_index(e, {i0: i0}) is e


def test_size_counts_every_occurrence_and_stops_past_its_limit() -> None:
    import random

    from kiln.inductor.ir.expr import walk

    rng = random.Random(1)
    for _ in range(300):
        e = _random_shared_body(rng)
        full = sum(1 for _ in walk(e))
        assert ir.size(e) == full
        for limit in (0, 1, 3, 8, 20):
            got = ir.size(e, limit=limit)
            assert got == full if full <= limit else got > limit
