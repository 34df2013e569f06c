"""The wrapper's extern calls, compared with eager on the C++ path."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from helpers import check


def _g(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def convnext_downsample(x, w1, b1, w2, b2):
    # NHWC math (ConvNeXt's LayerNorm2d) permuted to NCHW: the trace says the conv input (and so its
    # output) is channels-last; if kiln stores the permuted value contiguously the convolutions return
    # NCHW, and the reshape below must still read them right (ConvNeXt stage 0 -> stage 1).
    y = (x * 2 + 1).permute(0, 3, 1, 2)
    y = F.conv2d(F.conv2d(y, w1, b1, stride=2), w2, b2, padding=3, groups=8)
    return (y.permute(0, 2, 3, 1) + 1).reshape(-1, 8)


def test_extern_output_strides_differ_from_the_trace():
    check(convnext_downsample, _g(2, 8, 8, 4), _g(8, 4, 2, 2), _g(8), _g(8, 1, 7, 7), _g(8))


def test_extern_on_channels_last_input():
    # a channels-last input: eager convolution returns channels-last too
    x = _g(2, 4, 8, 8).to(memory_format=torch.channels_last)
    check(lambda x, w: (F.conv2d(x, w) + 1).flatten(1), x, _g(6, 4, 3, 3))


def test_restride_copies_an_extern_result_into_the_planned_strides():
    from kiln.inductor.codegen.wrapper import HEADER

    ns: dict = {}
    exec(HEADER.format(name="t"), ns)
    nchw = _g(2, 3, 4, 5)
    got = ns["_restride"](nchw, (2, 3, 4, 5), (60, 1, 15, 3))  # the plan said channels-last
    assert got.stride() == (60, 1, 15, 3) and torch.equal(got, nchw)
    same = ns["_restride"](nchw[:, :1], (2, 1, 4, 5), (60, 7, 5, 1))  # size-1 dims' strides do not matter
    assert same.data_ptr() == nchw.data_ptr()


def test_extern_outputs_go_through_restride():
    cg = check(lambda x, w: F.conv2d(x, w) + 1, _g(2, 4, 8, 8), _g(6, 4, 3, 3))
    body = cg.texts["output_code"].split("def call_owned")[1]
    assert "= _restride(" in body or "= _ext(" in body


def _ext_namespace(rows: list) -> dict:
    import json

    from kiln.inductor.codegen.wrapper import EXT_TABLE, HEADER

    ns: dict = {}
    exec(HEADER.format(name="t") + EXT_TABLE.format(table=json.dumps(rows)), ns)
    return ns


def test_ext_calls_with_the_table_constants_and_restrides():
    x, w = _g(2, 4, 8, 8), _g(6, 4, 3, 3)
    # the plan says channels-last: the result is copied into it; then NCHW: returned as it is
    ns = _ext_namespace([[[None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], [2, 6, 8, 8], [384, 1, 48, 6]],
                         [[None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], [2, 6, 6, 6], [216, 36, 6, 1]]])
    want = torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    got = ns["_ext"](torch.convolution, 0, x, w)
    assert got.stride() == (384, 1, 48, 6) and torch.equal(got, want)
    plain = ns["_ext"](torch.convolution, 1, x, w)
    assert plain.stride() == (216, 36, 6, 1)
    assert torch.equal(plain, torch.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))


def test_single_output_extern_is_one_short_statement_with_a_table_row():
    cg = check(lambda x, w: F.conv2d(x, w) + 1, _g(2, 4, 8, 8), _g(6, 4, 3, 3))
    code = cg.texts["output_code"]
    body = code.split("def call_owned")[1]
    m = re.search(r"^    buf\d+ = _ext\(torch\.convolution, (\d+), arg\d+, arg\d+\)  # ", body, re.M)
    assert m, body
    table = re.search(r"^_EXT, _ext, _ext2, _ext3 = _ext_callers\((.*)\)$", code, re.M)
    assert table, code
    import ast
    import json
    row = json.loads(ast.literal_eval(table.group(1)))[int(m.group(1))]
    assert row[0] == [None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1] and row[1] == [2, 6, 6, 6], row


def test_same_layout_reuse_keeps_one_name():
    # the pointwise result written over the matmul's memory: no ``bufB = bufA; del bufA`` statement
    cg = check(lambda x, w: ((x @ w) * 2).relu() @ w, _g(4, 4), _g(4, 4))
    body = cg.texts["output_code"].split("def call_owned")[1]
    assert not re.search(r"^    buf\d+ = buf\d+; del buf\d+", body, re.M), body


def test_cpp_kernels_are_bound_from_one_table():
    # two kernels with one body (each feeds an extern): the table binds both names to the shared symbol
    def f(x, w):
        a = (x * 2).exp() @ w
        return a, (a * 2).exp() @ w  # ``a`` is an output: the second kernel cannot write over it

    cg = check(f, _g(4, 4), _g(4, 4))
    code = cg.texts["output_code"]
    assert ".argtypes" not in code.split("def call_owned")[0]  # the helper sets them, from the table
    table = code.split('_bind_kernels(globals(), _lib, """\n')[1].split('"""')[0].splitlines()
    rows = [line.split() for line in table]
    launched = re.findall(r"^    (_k\w+)\(", code.split("def call_owned")[1], re.M)
    assert sorted(name for name, _, _ in rows) == sorted(launched) and len(launched) == 2
    assert len({symbol for _, symbol, _ in rows}) == 1, table
    assert all(int(n) == 2 for _, _, n in rows), table


def test_frees_wait_for_the_next_allocation_in_one_statement():
    # conv -> pointwise -> conv -> pointwise: the frees after a convolution and after the kernel that
    # follows it (which allocates nothing) are one ``del`` just before the next allocation
    def f(x, w1, w2):
        y = F.conv2d(x, w1, padding=1).relu() * 2
        return (F.conv2d(y, w2, padding=1) + 1).sigmoid()
    cg = check(f, _g(2, 4, 8, 8), _g(4, 4, 3, 3), _g(4, 4, 3, 3))
    lines = cg.texts["output_code"].split("def call_owned")[1].split("\n\n")[0].splitlines()
    for a, b in zip(lines, lines[1:]):
        assert not (a.strip().startswith("del ") and b.strip().startswith("_k")), lines
        assert not (a.strip().startswith("del ") and b.strip().startswith("del ")), lines


def test_ext2_ext3_take_argument_views_from_the_table():
    ns = _ext_namespace([[[], [3, 5], [5, 1], [[3, 4], [1, 3], 0], None],
                         [[], [4, 4], [4, 1], None, [[4, 2], [2, 1], 0], [[2, 4], [1, 2], 2]]])
    a, b = _g(12), _g(4, 5)
    got = ns["_ext2"](torch.mm, 0, a, b)  # a read as its transposed (3, 4) view
    assert torch.equal(got, torch.mm(a.as_strided((3, 4), (1, 3)), b))
    bias, m, w = _g(4, 4), _g(8), _g(11)
    want = torch.addmm(bias, m.as_strided((4, 2), (2, 1)), w.as_strided((2, 4), (1, 2), 2))
    assert torch.equal(ns["_ext3"](torch.addmm, 1, bias, m, w), want)  # the offset adds to the buffer's


def test_mm_of_a_transposed_weight_is_one_statement_without_views():
    # a linear layer: mm(x, w.t()) is called as linear(x, w): no view of w, in the statement or in the
    # table row (the transpose is taken in C++)
    cg = check(lambda x, w: (F.linear(x, w) + 1).relu(), _g(4, 6), _g(5, 6))
    code = cg.texts["output_code"]
    body = code.split("def call_owned")[1]
    assert re.search(r"^    buf\d+ = _ext\(_linear, \d+, \w+, arg1\)  # extern aten.mm.default", body, re.M), body
    assert ".as_strided(" not in body.split("return")[0], body
    assert '[[],[4,5],[5,1]]' in code, code  # the table row: no constants, the output's size and stride, no views
    for _ in range(3):  # fresh inputs
        x, w = torch.randn(4, 6), torch.randn(5, 6)
        torch.testing.assert_close(cg.fn(x, w)[0], (F.linear(x, w) + 1).relu())


def test_wrapper_imports_its_constant_helpers():
    # helpers (restride, the extern table's callers, the C++ library loader and binder) are
    # kiln.runtime's: a loaded artifact does not compile them again (only the graph's own code)
    cg = check(lambda x, w, m: ((F.conv2d(x, w) + 1).flatten(1) @ m).relu(), _g(2, 4, 8, 8), _g(6, 4, 3, 3),
               _g(216, 5))
    code = cg.texts["output_code"]
    head = code.split("\ndef call(")[0]
    assert "def " not in head and "class " not in head, head
    assert "from kiln.runtime.program_helpers import" in head and "_bind_kernels(globals(), _lib" in head
    assert "kiln.runtime" in cg.portable.requires
