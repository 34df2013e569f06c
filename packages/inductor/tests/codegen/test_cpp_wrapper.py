"""The C++ wrapper's text for small graphs (no C++ build here: tests/test_deploy_cpp.py builds and runs
packages): typed matmul and convolution calls, boxed dispatcher calls with the schema's defaults for
other ATen ops, kernels by symbol, outputs written into the caller's buffers, and clear refusals."""

from __future__ import annotations

import pytest
import torch
from tracer import trace

from kiln.inductor.codegen.cpp_wrapper import CppWrapperUnsupported, Slot, cpp_program
from kiln.inductor.codegen.cpp_wrapper.aten_calls import ivalue
from kiln.inductor.ir import ConstArg, ListArg


def program(fn, *args, constants=0):  # type: ignore[no-untyped-def]
    n = len(args)
    slots = {k: Slot("input", k) if k < n - constants else Slot("constant", k - (n - constants)) for k in range(n)}
    return cpp_program(trace(fn, *args), list(args), slots)


def test_linear_relu_sum() -> None:
    w, b, x = torch.randn(16, 8), torch.randn(16), torch.randn(4, 8)
    p = program(lambda x, w, b: (torch.relu(x @ w.t() + b), x.sum()), x, w, b, constants=2)
    src = p.wrapper_source
    assert "wrap(inputs[0], {4, 8}, {8, 1}, at::ScalarType::Float);  // input 0" in src
    assert "wrap(constants[1], {16}, {1}, at::ScalarType::Float);  // constant 1" in src
    assert "at::addmm(" in src or "at::mm(" in src
    assert "at::Tensor buf2 = wrap(outputs[1], {}, {}, at::ScalarType::Float);  // output 1, computed in place" in src
    # output 0 is written over the matmul's result (ATen's memory): copied into the caller's buffer
    assert "wrap(outputs[0], {4, 16}, {16, 1}, at::ScalarType::Float).copy_(buf3);" in src
    assert "#include <ATen/ops/" in src and "kiln_model_run" in src
    assert p.n_kernels >= 1 and p.kernel_source.count('extern "C" void') >= 1
    assert [(o[0], o[2]) for o in p.outputs] == [((4, 16), torch.float32), ((), torch.float32)]


def test_multi_output_fallback_is_a_boxed_call_with_defaults() -> None:
    x = torch.randn(6, 8)
    p = program(lambda x: torch.topk(x, 3, dim=-1), x)
    src = p.wrapper_source
    assert 'd.findSchemaOrThrow("aten::topk", "")' in src
    # topk(self, k, dim=-1, largest=True, sorted=True): every argument on the stack, defaults included
    assert "Stack s{c10::IValue(arg0), c10::IValue(int64_t(3LL)), c10::IValue(int64_t(-1LL)), " \
           "c10::IValue(true), c10::IValue(true)};" in src
    assert "= restride(s[0]," in src and "= restride(s[1]," in src


def test_convolution_is_typed() -> None:
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    src = program(lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), x, w, constants=1).wrapper_source
    assert "at::convolution(arg0, arg1, std::optional<at::Tensor>(), at::IntArrayRef({int64_t(1), int64_t(1)})" in src


def test_ivalue_forms() -> None:
    assert ivalue(ConstArg(None), "Optional[Tensor]", str) == "c10::IValue()"
    assert ivalue(ConstArg(torch.float16), "Optional[ScalarType]", str) == "c10::IValue(at::ScalarType::Half)"
    assert ivalue(ConstArg(float("inf")), "float", str) == \
        "c10::IValue(double(std::numeric_limits<double>::infinity()))"
    assert ivalue(ListArg((ConstArg(2), ConstArg(3))), "List[int]", str) == \
        "c10::IValue(c10::List<int64_t>({int64_t(2LL), int64_t(3LL)}))"
    assert ivalue(ConstArg(2), "Scalar", str) == "c10::IValue(int64_t(2LL))"


def test_cuda_inputs_refused() -> None:
    with pytest.raises(CppWrapperUnsupported, match="CPU only"):
        cpp_program(trace(lambda x: x + 1, torch.randn(2)), [_FakeCuda()], {0: Slot("input", 0)})


class _FakeCuda(torch.Tensor):
    """Stands in for a CUDA tensor (this host has none): only ``.device`` is read before refusing."""

    @staticmethod
    def __new__(cls):  # type: ignore[no-untyped-def]
        return torch.Tensor._make_subclass(cls, torch.empty(2))

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_python_registered_ops_refused() -> None:
    from kiln.inductor.codegen.cpp_wrapper.aten_calls import op_overload

    with pytest.raises(CppWrapperUnsupported, match="not an ATen op.*torch.library"):
        op_overload("mylib.scale.default")
