"""kiln.compile's C++ wrapper text (codegen/cpp_wrapper/graph_call.py) for small graphs, no build here
(tests/test_cpp_wrapper.py builds and runs it): per-call inputs, bare pointers for inputs only kernels
read, and the output plan: the library hands over the program's own buffer (or a view of it), a copy laid out
as the view (the caller's memory), or nothing (the input itself); the caller allocates no output."""

from __future__ import annotations

import re

import torch
from dynamic_helpers import symbolic_graph
from tracer import trace

from kiln.inductor.codegen.cpp_wrapper.graph_call import GraphCallWriter, output_plan
from kiln.inductor.cpp_program import Slot, cpp_program


def program(fn, *args):  # type: ignore[no-untyped-def]
    return cpp_program(trace(fn, *args), list(args), {k: Slot("input", k) for k in range(len(args))},
                       writer=GraphCallWriter)


def test_inputs_per_call_and_kernel_only_inputs_as_pointers() -> None:
    w, b, x = torch.randn(16, 8), torch.randn(16), torch.randn(4, 8)
    p = program(lambda x, w, b: (torch.relu(x @ w.t() + b), x.sum()), x, w, b)
    src = p.wrapper_source
    assert "constants[" not in src.split("static void run_graph", 1)[1].split("KILN_EXPORT", 1)[0]
    assert "Tensor arg1 = kiln_rt::wrap(dev, inputs[1], {16, 8}, {8, 1}, 6 /*float32*/);  // input 1" in src
    assert "void* const arg2 = inputs[2];  // input 2" in src and "arg2.data()" not in src
    assert p.scheduled is not None
    plan = output_plan(p.scheduled)
    assert [(q.kind, q.shape, q.stride, q.offset) for q in plan] == [("direct", (4, 16), (16, 1), 0),
                                                                     ("direct", (), (), 0)]
    # both are buffers the program allocated as it computed them (no caller buffer, no copy), handed over
    assert "outputs[" not in src.split("kiln_rt::hand_over(outputs", 1)[0].split("static void run_graph", 1)[1]
    assert re.search(r"kiln_rt::hand_over\(outputs, \{\n      (buf\d+),  // output 0\n      (buf\d+),  // output 1\n  \}\);",
                     src)
    assert "copy_as" not in src


def test_output_at_an_offset_is_a_view_of_the_programs_buffer() -> None:
    x = torch.randn(4, 5)
    p = program(lambda x: ((x @ x.t())[1:], (x @ x.t()).sum()), x)
    assert p.scheduled is not None
    first = output_plan(p.scheduled)[0]
    assert (first.kind, first.shape, first.stride, first.offset) == ("direct", (3, 4), (4, 1), 4)
    assert re.search(r"kiln_rt::as_strided\(buf\d+, \{3, 4\}, \{4, 1\}, 4\),  // output 0", p.wrapper_source)


def test_views_of_an_input_are_copied_in_their_layout() -> None:
    """An output over the caller's memory (a view of an input, not the whole input) is copied at the end
    into fresh memory laid out as the view, at its storage offset; the whole input is not handed over."""
    x = torch.randn(4, 5)
    p = program(lambda x: (x.view(-1)[3:9], x, x.t()), x)
    assert p.scheduled is not None
    plan = output_plan(p.scheduled)
    assert [(q.kind, q.shape, q.stride, q.offset, q.input) for q in plan] == [
        ("copy", (6,), (1,), 3, -1), ("input", (4, 5), (5, 1), 0, 0), ("copy", (5, 4), (1, 5), 0, -1)]
    src = p.wrapper_source
    assert "kiln_rt::copy_as(dev, kiln_rt::as_strided(arg0, {6}, {1}, 3), {6}, {1}, 3, 6 /*float32*/),  // output 0" \
        in src
    assert "      Tensor(),  // output 1" in src


def test_input_written_in_place_is_returned_not_copied() -> None:
    """An index_put_ into its input (a KV cache: reinplaced, kiln.inductor's graph_passes/reinplace.py)
    makes an output that is the input's memory: the plan returns input 0 and the C++ copies nothing."""
    cache, idx, rows = torch.zeros(6, 4), torch.tensor([2]), torch.randn(1, 4)
    gm = trace(lambda c, i, r: torch.ops.aten.index_put_.default(c, [i], r), cache, idx, rows)
    p = cpp_program(gm, [cache, idx, rows], {k: Slot("input", k) for k in range(3)}, writer=GraphCallWriter)
    assert p.scheduled is not None
    plan = output_plan(p.scheduled)
    assert [(q.kind, q.input) for q in plan] == [("input", 0)]
    assert "copy_as" not in p.wrapper_source and "kiln_rt::hand_over(outputs, {Tensor()});" in p.wrapper_source


def test_matmul_output_is_the_matmuls_result() -> None:
    """A matmul whose result (here through a reshape) is an output: ATen's result, allocated when the
    matmul runs, is handed over as a view (a language model's logits: not allocated before the call, not
    copied after it)."""
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    p = program(lambda x, w: ((x @ w).view(2, 2, 16), (x @ w).sum()), x, w)
    src = p.wrapper_source
    assert p.scheduled is not None
    plan = output_plan(p.scheduled)
    assert (plan[0].kind, plan[0].shape, plan[0].stride) == ("direct", (2, 2, 16), (32, 16, 1))
    mm = re.search(r"Tensor (buf\d+) = kiln_rt::restride\(dev, kiln_rt::mm\(", src)
    assert mm and f"kiln_rt::as_strided({mm.group(1)}, {{2, 2, 16}}, {{32, 16, 1}}, 0),  // output 0" in src
    assert "copy_as" not in src


def test_same_buffer_twice_and_views_of_one_output_are_handed_over_as_views() -> None:
    """One value returned twice, and outputs that view it: each the program's one buffer (so they share
    memory, as in eager), never copied. (Equal values computed twice, ``(x * 2, x * 2)``, are two tensors in
    eager and stay two: the cse pass does not merge outputs.)"""
    x = torch.randn(4, 5)

    def shared(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return y, y, y.t(), y.view(-1)[5:]
    p = program(shared, x)
    assert p.scheduled is not None
    plan = output_plan(p.scheduled)
    assert [q.kind for q in plan] == ["direct"] * 4
    assert [q.offset for q in plan] == [0, 0, 0, 5]
    assert "copy_as" not in p.wrapper_source


def test_symbolic_output_plan_is_expressions_over_the_size_arguments() -> None:
    """Symbolic sizes: the plan's sizes are expressions over the size symbols (as Python), a matmul output is
    the matmul's result, and a row view at a symbolic offset a view of the program's buffer there."""
    x, w = torch.randn(6, 8), torch.randn(8, 16)
    # two products (equal ones would be computed once: the cse pass), each output a view of its own
    gm, examples = symbolic_graph(lambda x, w: ((x @ w).unsqueeze(0), (x @ (w + 1))[-1]), x, w, dynamic={0: (0,)})
    n = str(examples[0].shape[0])
    p = cpp_program(gm, examples, {0: Slot("input", 0), 1: Slot("input", 1)}, size_symbols=[(n, "input 0 dim 0")],
                    writer=GraphCallWriter)
    assert p.scheduled is not None
    first, last = output_plan(p.scheduled)
    assert first.kind == "direct" and not first.static
    assert first.as_json()[1:4] == [[1, n, 16], [1, 16, 1], 0]
    assert last.kind == "direct" and last.as_json()[1:3] == [[16], [1]]
    assert eval(last.as_json()[3], {n: 5}) == 64  # noqa: S307 - the last row of a 5-row output
    assert f"const int64_t {n} = sizes[0];" in p.wrapper_source
    assert "copy_as" not in p.wrapper_source


def test_a_cuda_launch_over_the_launchers_argument_limit_is_refused_when_written() -> None:
    # refused while the wrapper is written (the graph keeps its Python wrapper), not in the middle of a call
    # after earlier kernels ran (model_support_cuda.cpp's launcher takes at most CUDA_LAUNCH_ARGS)
    import pytest

    from kiln.inductor.codegen.cpp_wrapper.writer import (
        CUDA_LAUNCH_ARGS,
        CudaKernels,
        cpp_wrapper_source,
    )
    from kiln.inductor.codegen.triton.cubins import CubinSite
    from kiln.inductor.cpp_program import CppWrapperUnsupported

    x = torch.randn(4)
    p = program(lambda x: (x.sin(),), x)
    assert p.scheduled is not None
    (k,) = p.scheduled.launched()
    many = CubinSite(k.name, 0, ("1", "1", "1"), ("arg0",) * (CUDA_LAUNCH_ARGS + 1))
    with pytest.raises(CppWrapperUnsupported, match=f"at most {CUDA_LAUNCH_ARGS} arguments"):
        cpp_wrapper_source(p.scheduled, {}, {0: Slot("input", 0)}, CudaKernels([], {k.name: [many]}, 90))
    fits = CubinSite(k.name, 0, ("1", "1", "1"), ("arg0",) * CUDA_LAUNCH_ARGS)
    assert "launch(" in cpp_wrapper_source(p.scheduled, {}, {0: Slot("input", 0)}, CudaKernels([], {k.name: [fits]}, 90))
