"""The loop IR's text form read back: programs print the same after a round trip and equal the original."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sympy
import torch
from golden_programs import corpus

from kiln.graph import read_golden
from kiln.inductor import ir
from kiln.inductor.ir import IRParseError, parse_index, parse_layout, parse_program

GOLDEN = Path(__file__).parent.parent / "golden"


@pytest.fixture(scope="module")
def programs() -> dict[str, ir.LoopProgram]:
    return corpus()


def _without_origins(p: ir.LoopProgram) -> ir.LoopProgram:
    nodes = tuple(dataclasses.replace(n, origins=()) if isinstance(n, ir.ComputedBuffer) else n for n in p.nodes)
    return dataclasses.replace(p, nodes=nodes)


def test_every_lowered_program_round_trips(programs) -> None:
    assert len(programs) >= 15
    for name, p in programs.items():
        text = p.as_text()
        back = parse_program(text)
        assert back.as_text() == text, name
        # dtypes, extern names and output paths are inferred; here the guesses hold (origins are not printed)
        assert back == _without_origins(p), name
        ir.verify_program(back)


def test_golden_files_round_trip() -> None:
    files = sorted(GOLDEN.glob("*/*.txt"))
    assert files
    for path in files:
        golden = read_golden(path)
        for text in (golden.input, golden.expected):
            body = text.split("\n", 1)[1] if text.startswith("# ") and "reduction(s) split" in text else text
            if body.startswith("# loop program"):
                assert parse_program(body).as_text() == body, path


def test_index_expressions() -> None:
    i0, i1 = ir.index_vars("i", 2)
    r0 = ir.index_var("r", 0)
    assert parse_index("8*i0 + i1") == 8 * i0 + i1
    assert parse_index("-1 + 4*i0 + -3*r0") == 4 * i0 - 3 * r0 - 1
    assert parse_index("(i1)//2") == ir.FloorDiv(i1, 2)
    nested = ir.ModIndex(ir.FloorDiv(i0 + 3 * i1, 4), 6)
    from kiln.inductor.ir.index import index_str
    assert parse_index(index_str(nested)) == nested
    assert parse_index("4*((i0)//3)") == 4 * ir.FloorDiv(i0, 3)
    assert parse_index("7") == sympy.Integer(7)


def test_layouts() -> None:
    lay = parse_layout("float16[4, 8](1, 4) +2", device="cuda")
    assert lay == ir.Layout((sympy.Integer(4), sympy.Integer(8)), (sympy.Integer(1), sympy.Integer(4)), torch.float16,
                            "cuda", sympy.Integer(2))
    assert lay.as_text() == "float16[4, 8](1, 4) +2"
    assert parse_layout("bool[]()").shape == ()


def test_dtypes_are_inferred_from_context() -> None:
    p = parse_program("# loop program g\n"
                      "arg0: float16[4](1) = input 0\n"
                      "arg1: int64[4](1) = input 1\n"
                      "buf0: bool[4](1) = pointwise[4] logical_and(gt(arg0[i0], 0.5), lt(index(i0), 3))\n"
                      "buf1: float16[4](1) = pointwise[4] where(buf0[i0], add(arg0[i0], 1.0), 0.0)\n"
                      "buf2: int64[]() = reduce_argmax[ | 4] to_float32(arg0[r0])\n"
                      "buf3: float32[4](1) = pointwise[4] to_float32(arg0[d0 | d0=arg1[i0]])\n"
                      "return (buf1.view([4], (1), +0), buf2.view([], (), +0), 3)")
    ir.verify_program(p)
    cmp = p.nodes[0].data.body.args[0]
    assert cmp.args[0].dtype == torch.float16 and cmp.args[1] == ir.Constant(0.5, torch.float16)
    assert p.nodes[0].data.body.args[1].args[0] == ir.IndexValue(ir.index_var("i", 0), torch.int64)
    sel = p.nodes[1].data.body
    assert sel.dtype == torch.float16 and sel.args[2] == ir.Constant(0.0, torch.float16)
    assert p.outputs[-1] == ir.ConstArg(3)


@pytest.mark.parametrize(("text", "message"), [
    ("arg0: float32[4](1) = input 0\nbuf0: float32[4](1) = pointwise[4] frobnicate(arg0[i0])",
     "line 3: unknown op 'frobnicate'"),
    ("buf0: float32[4](1) = pointwise[4] sin(arg9[i0])", "line 2: loads 'arg9' before it is defined"),
    ("arg0: floaty[4](1) = input 0", "line 2: unknown dtype 'floaty'"),
    ("arg0: float32[4](1) = something else", "line 2: bad loop node"),
])
def test_bad_text_names_the_line(text: str, message: str) -> None:
    with pytest.raises(IRParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_program(f"# loop program bad\n{text}\nreturn ()")


def test_a_program_needs_its_header_and_return() -> None:
    with pytest.raises(IRParseError, match="starts with '# loop program NAME'"):
        parse_program("arg0: float32[4](1) = input 0")
    with pytest.raises(IRParseError, match="ends with 'return"):
        parse_program("# loop program g\narg0: float32[4](1) = input 0")
