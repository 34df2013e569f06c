"""The C++ wrapper's text for small graphs (no C++ build here: tests/test_deploy_cpp.py builds and runs
packages): typed matmul and convolution calls, boxed dispatcher calls with the schema's defaults for
other ATen ops, kernels by symbol, outputs allocated by the program and handed over, and clear refusals."""

from __future__ import annotations

import re

import pytest
import torch
from dynamic_helpers import symbolic_graph
from tracer import trace

from kiln.inductor.codegen.cpp_wrapper.aten_calls import op_overload, push
from kiln.inductor.cpp_program import CppWrapperUnsupported, Slot, cpp_program
from kiln.inductor.ir import ConstArg, ListArg


def program(fn, *args, constants=0):  # type: ignore[no-untyped-def]
    n = len(args)
    slots = {k: Slot("input", k) if k < n - constants else Slot("constant", k - (n - constants)) for k in range(n)}
    return cpp_program(trace(fn, *args), list(args), slots)


def test_linear_relu_sum() -> None:
    w, b, x = torch.randn(16, 8), torch.randn(16), torch.randn(4, 8)
    p = program(lambda x, w, b: (torch.relu(x @ w.t() + b), x.sum()), x, w, b, constants=2)
    src = p.wrapper_source
    assert "Tensor arg0 = kiln_rt::wrap(dev, inputs[0], {4, 8}, {8, 1}, 6 /*float32*/);  // input 0" in src
    # the bias only a kernel reads: its data pointer, no at::Tensor made per call (the weight feeds mm: wrapped)
    assert "void* const arg2 = constants[1];  // constant 1" in src and "arg2.data()" not in src
    assert "Tensor arg1 = kiln_rt::wrap(dev, constants[0], {16, 8}, {8, 1}, 6 /*float32*/);  // constant 0" in src
    assert "kiln_rt::mm(arg0, kiln_rt::as_strided(arg1, {8, 16}, {1, 8}, 0))" in src
    # every output is the program's own buffer, allocated when computed and handed over at the end (no copy)
    assert "Tensor buf2 = kiln_rt::empty_strided(dev, {}, {}, 6 /*float32*/);" in src
    assert "kiln_rt::hand_over(outputs, {\n      buf3,  // output 0\n      buf2,  // output 1\n  });" in src
    assert "copy_as" not in src
    # no torch header: the wrapper builds in well under a second (kiln/model_support.h)
    includes = [line for line in src.splitlines() if line.startswith("#include")]
    assert includes == ["#include <kiln/model_support.h>", "#include <cstdint>", "#include <cstring>", "#include <limits>",
                        "#include <stdexcept>", "#include <string>"]
    assert "kiln_model_run" in src and 'kiln_model_device() { return "cpu"; }' in src
    assert p.n_kernels >= 1 and p.kernel_source.count('extern "C" void') >= 1
    assert [(o[0], o[2]) for o in p.outputs] == [((4, 16), torch.float32), ((), torch.float32)]


def test_symbolic_sizes_are_arguments_and_relations_are_checked() -> None:
    """A symbolic program: the size symbols come in ``sizes`` (in the order named), every size is an
    expression over them, kernels take them as arguments, and the relation the reshape assumed is checked."""
    x, w = torch.randn(6, 8), torch.randn(16, 8)
    gm, examples = symbolic_graph(lambda x, w: (torch.relu(x @ w.t()), x.sum(1).reshape(-1, 2)), x, w,
                                  dynamic={0: (0,)})
    n = str(examples[0].shape[0])
    slots = {0: Slot("input", 0), 1: Slot("constant", 0)}
    p = cpp_program(gm, examples, slots, size_symbols=[(n, "input 'x' dim 0")])
    src = p.wrapper_source
    assert p.size_symbols == (n,)
    assert f"  const int64_t {n} = sizes[0];  // input 'x' dim 0" in src
    assert f"Tensor arg0 = kiln_rt::wrap(dev, inputs[0], {{{n}, 8}}, {{8, 1}}, 6 /*float32*/);  // input 0" in src
    assert re.search(rf"  k\w+\(.*, {n}\);", src)  # a kernel's size argument
    assert re.search(r'extern "C" void k\w+\((void\*, )+int64_t\);', src)
    assert f"({n} % 2) == 0" in [g.expr for g in p.size_guards]
    assert f'if (!(({n} % 2) == 0)) throw std::runtime_error(' in src
    assert "check_sizes(sizes);" in src
    with pytest.raises(CppWrapperUnsupported, match="name its size symbols"):
        cpp_program(gm, examples, slots)


def test_outputs_over_the_callers_memory_are_copied() -> None:
    """A package's output that is an input, a constant or a view of one is the caller's memory (a runner's
    input may be a temporary; the weights are mapped read-only): copied, laid out as the manifest says (a
    view that is not dense: contiguous); the program's own buffer is handed over as it is."""
    x, c = torch.randn(4, 6), torch.randn(6, 4)
    p = program(lambda x, c: (x, c.t(), x[:, ::2], (x * 2)[1:]), x, c, constants=1)
    src = p.wrapper_source
    assert "      kiln_rt::copy_as(dev, arg0, {4, 6}, {6, 1}, 0, 6 /*float32*/),  // output 0" in src
    assert "      kiln_rt::copy_as(dev, kiln_rt::as_strided(arg1, {4, 6}, {1, 4}, 0), {4, 6}, {1, 4}, 0, " \
           "6 /*float32*/),  // output 1" in src
    assert "      kiln_rt::copy_as(dev, kiln_rt::as_strided(arg0, {4, 3}, {6, 2}, 0), {4, 3}, {3, 1}, 0, " \
           "6 /*float32*/),  // output 2" in src
    assert re.search(r"\n      buf\d+,  // output 3\n", src)  # (only the rows it returns computed)
    assert [(o[0], o[1]) for o in p.outputs] == [((4, 6), (6, 1)), ((4, 6), (1, 4)), ((4, 3), (3, 1)),
                                                 ((3, 6), (6, 1))]


def test_multi_output_fallback_is_a_boxed_call_with_defaults() -> None:
    x = torch.randn(6, 8)
    p = program(lambda x: torch.topk(x, 3, dim=-1), x)
    src = p.wrapper_source
    assert 'names[] = {"aten::topk"}' in src and 'overloads[] = {""}' in src
    # topk(self, k, dim=-1, largest=True, sorted=True): every argument on the stack, defaults included
    assert "s.tensor(arg0).i(3LL).i(-1LL).b(true).b(true);" in src
    assert "= kiln_rt::restride(dev, s.out(0)," in src and "= kiln_rt::restride(dev, s.out(1)," in src


def test_convolution_is_typed() -> None:
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    src = program(lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), x, w, constants=1).wrapper_source
    assert "kiln_rt::convolution(arg0, arg1, kiln_rt::Tensor(), {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1)" in src


def test_push_forms() -> None:
    assert push(ConstArg(None), "Optional[Tensor]", str) == ".none()"
    # None for a Tensor that is not optional (cuDNN attention backward's cum_seq_q, None in the traced graph): an
    # undefined tensor, as Python's binding passes; an IValue None fails the op's unboxing
    assert push(ConstArg(None), "Tensor", str) == ".tensor(kiln_rt::Tensor())"
    assert push(ConstArg(torch.float16), "Optional[ScalarType]", str) == ".scalar_type(5 /*float16*/)"
    assert push(ConstArg(float("inf")), "float", str) == ".d(std::numeric_limits<double>::infinity())"
    assert push(ConstArg(2), "float", str) == ".d(2.0)"
    assert push(ListArg((ConstArg(2), ConstArg(3))), "List[int]", str) == ".ints({2LL, 3LL})"
    assert push(ConstArg(2), "Scalar", str) == ".i(2LL)"
    assert push(ConstArg(torch.device("cpu")), "Optional[Device]", str) == '.device("cpu")'
    assert push(ListArg((ConstArg(None),)), "List[Optional[Tensor]]", str) == ".optional_tensors({kiln_rt::Tensor()})"


def test_cuda_graph_needs_an_arch_and_one_device() -> None:
    """(CUDA programs are built and checked in tests/test_deploy_cuda.py: their cubins need triton's compiler.)"""
    with pytest.raises(CppWrapperUnsupported, match="needs cuda_arch"):
        cpp_program(trace(lambda x: x + 1, torch.randn(2)), [_FakeCuda()], {0: Slot("input", 0)})
    with pytest.raises(CppWrapperUnsupported, match="one device, CPU or CUDA"):
        cpp_program(trace(lambda x, y: x + y, torch.randn(2), torch.randn(2)), [_FakeCuda(), torch.randn(2)],
                    {0: Slot("input", 0), 1: Slot("input", 1)}, cuda_arch=90)


class _FakeCuda(torch.Tensor):
    """Stands in for a CUDA tensor (this host has none): only ``.device`` is read before refusing."""

    @staticmethod
    def __new__(cls):  # type: ignore[no-untyped-def]
        return torch.Tensor._make_subclass(cls, torch.empty(2))

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_python_registered_ops_refused() -> None:
    with pytest.raises(CppWrapperUnsupported, match="not an ATen op.*torch.library"):
        op_overload("mylib.scale.default")
