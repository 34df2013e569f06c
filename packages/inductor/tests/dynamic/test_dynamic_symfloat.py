"""Floats computed from symbolic sizes (SymFloats: ``1.0 / n``, ``sqrt(d)``, interpolation scales) are
float64 values over the kernels' size arguments (ir/scalars.py): one compile serves every size, on the
C++ path and the Triton interpreter, with no ATen fallback, and the elementwise results are the bits
eager computes (the double Python computed, cast to the op's dtype)."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from dynamic_helpers import BACKENDS, CPP, check_sizes, compile_symbolic, is_dynamic, symbolic_graph
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from kiln.inductor import DynamicShapeUnsupported, compile_graph
from kiln.inductor.ir import ExternKernel, SymScalar, op, python_scalar, sym_scalar
from kiln.inductor.ir.expr import Cast, Constant, IndexValue

torch.manual_seed(0)
SIZES = (1, 2, 7, 64, 3)
EXACT = {"atol": 0.0, "rtol": 0.0}


def _compile(fn, make_args, options, dims, example=5):
    cg = compile_symbolic(fn, *make_args(example), options=options, dynamic=dims)
    assert is_dynamic(cg), cg.loop_program.as_text()
    fallbacks = [n.target for n in cg.loop_program.nodes if isinstance(n, ExternKernel)]
    assert not fallbacks, fallbacks
    return cg


# name -> (fn, inputs of size n, dynamic dims, exact): elementwise uses of the scalar are bit-exact
ELEMENTWISE = {
    "mul_inverse": (lambda x: (x * (1.0 / x.shape[0]),), lambda n: (torch.randn(n, 4),), {0: (0,)}),
    "div_sqrt": (lambda x: (x / torch.sym_sqrt(x.shape[-1]),), lambda n: (torch.randn(3, n),), {0: (1,)}),
    "pow_half": (lambda x: (x * x.shape[-1] ** -0.5,), lambda n: (torch.randn(3, n),), {0: (1,)}),
    "full_inverse": (lambda x: (x + torch.full((x.shape[0],), 1.0 / x.shape[0]).unsqueeze(-1),),
                     lambda n: (torch.randn(n, 4),), {0: (0,)}),
    "ratio_and_shift": (lambda x: (x * (x.shape[0] / x.shape[1]) - (x.shape[1] - 1.5),),
                        lambda n: (torch.randn(n, n + 3),), {0: (0, 1)}),
    "where_clamp": (lambda x: (torch.where(x > 0, x, 1.0 / x.shape[0]).clamp(max=x.shape[0] * 0.25),),
                    lambda n: (torch.randn(n, 4),), {0: (0,)}),
    "bf16": (lambda x: (x * (1.0 / x.shape[0]), x / torch.sym_sqrt(x.shape[0])),
             lambda n: (torch.randn(n, 4).bfloat16(),), {0: (0,)}),
    "arange_scaled": (lambda x: (x + torch.arange(x.shape[0]) * (1.0 / x.shape[0]),
                                 torch.arange(x.shape[0], 2 * x.shape[0]) + x),
                      lambda n: (torch.randn(n),), {0: (0,)}),
}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_symbolic_float_is_exact(options, name):
    fn, make, dims = ELEMENTWISE[name]
    check_sizes(_compile(fn, make, options, dims), fn, make, SIZES, **EXACT)


# reductions sum in another order than ATen; ATen's add computes ``x + alpha * y`` as one FMA
TOLERANT = {
    "add_alpha": (lambda x: (torch.add(x, x * 3, alpha=1.0 / x.shape[0]),), lambda n: (torch.randn(n, 4),)),
    "sum_over_batch": (lambda x: (x.sum() / x.shape[0],), lambda n: (torch.randn(n, 4),)),
    "loss_times_inverse": (lambda x: ((x * x).sum() * (1.0 / x.shape[0]),), lambda n: (torch.randn(n, 4),)),
    "mean_as_sum_times_inverse": (lambda x: (x.sum(0) * (1.0 / x.shape[0]), x.mean(0)),
                                  lambda n: (torch.randn(n, 4),)),
    "softmax_temperature": (lambda x: ((x / torch.sym_sqrt(x.shape[0])).softmax(0),),
                            lambda n: (torch.randn(n, 4),)),
}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(TOLERANT))
def test_reductions_and_fma_with_symbolic_float(options, name):
    fn, make = TOLERANT[name]
    check_sizes(_compile(fn, make, options, {0: (0,)}), fn, make, SIZES, atol=1e-6, rtol=1e-5)


INTERPOLATE = {
    "nearest_scale": (lambda x: (F.interpolate(x, scale_factor=2.0, mode="nearest"),), {0: (2,)}),
    "linear_size": (lambda x: (F.interpolate(x, size=(2 * x.shape[-1] + 1,), mode="linear"),), {0: (2,)}),
    "bilinear_align": (lambda x: (F.interpolate(x.unsqueeze(2).expand(-1, -1, 3, -1), scale_factor=2.0,
                                                mode="bilinear", align_corners=True),), {0: (2,)}),
}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(INTERPOLATE))
def test_interpolate_scales_from_sizes(options, name):
    """The scale (in / out, from sizes) is a symbolic float; ATen's kernel computes it in float32 where
    the decomposition keeps the double, hence a last-bit tolerance."""
    fn, dims = INTERPOLATE[name]
    make = lambda n: (torch.randn(2, 3, n),)  # noqa: E731
    check_sizes(_compile(fn, make, options, dims), fn, make, SIZES, atol=1e-6, rtol=1e-6)


def test_loop_ir_keeps_the_double_expression():
    fn, make, dims = ELEMENTWISE["mul_inverse"]
    cg = _compile(fn, make, CPP, dims)
    (sym,) = [z.symbol for z in cg.loop_program.sizes if z.source == "arg0.size(0)"]
    assert f"to_float32(truediv(1.0, to_float64(index({sym}))))" in cg.loop_program.as_text()


def test_op_without_a_symbolic_float_rule_gets_it_from_the_wrapper():
    """leaky_relu's rule reads its slope as a number: it runs through ATen, the wrapper computing the
    slope in Python from the call's sizes (a perf hint says so); correct for every size."""
    def fn(x):
        return (F.leaky_relu(x, 1.0 / torch.sym_sqrt(x.shape[0])),)
    make = lambda n: (torch.randn(n, 4),)  # noqa: E731
    gm, examples = symbolic_graph(fn, *make(5), dynamic={0: (0,)})
    cg = compile_graph(gm, examples, options=CPP)
    externs = [n.target for n in cg.loop_program.nodes if isinstance(n, ExternKernel)]
    assert externs == ["aten.leaky_relu.default"]
    assert "math.sqrt(float(" in cg.texts["output_code"]
    check_sizes(cg, fn, make, SIZES, **EXACT)


def test_python_form_of_a_symbolic_float():
    """What the wrapper computes for an extern's symbolic float argument: the same operations."""
    f64 = torch.float64
    n = Cast(IndexValue(sympy.Symbol("s0", integer=True, nonnegative=True), torch.int64), f64)
    value = op("truediv", Constant(1.0, f64), op("sqrt", n, dtype=f64), dtype=f64)
    text = python_scalar(SymScalar(value), str)
    assert text == "(1.0 / math.sqrt(float(s0)))"
    assert eval(text, {"math": math, "s0": 7}) == 1.0 / math.sqrt(7)  # noqa: S307


DERIVED = {
    "linear_1_5": lambda x: (F.interpolate(x, scale_factor=1.5, mode="linear"),),
    "nearest_0_5": lambda x: (F.interpolate(x, scale_factor=0.5, mode="nearest"),),
    "recompute_scale": lambda x: (F.interpolate(x, scale_factor=1.5, mode="linear", recompute_scale_factor=True),),
    "int_of_float_as_value": lambda x: (x * torch.sym_int(x.shape[-1] * 0.5 - 3),),
    "flattened": lambda x: (F.interpolate(x, scale_factor=1.5, mode="nearest").flatten(1) * 2,),
}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(DERIVED))
def test_sizes_floored_from_floats(options, name):
    """A size torch computes by flooring a float (``floor(1.5 * n)``: interpolation by a non-integer
    scale) is a size argument of its own, computed by the wrapper in Python as torch computed it."""
    fn = DERIVED[name]
    make = lambda n: (torch.randn(2, 3, n),)  # noqa: E731
    cg = _compile(fn, make, options, {0: (2,)})
    (derived,) = [z for z in cg.loop_program.sizes if z.source.startswith("int(")]
    assert derived.hint == int(eval(derived.source, {}, cg.loop_program.hints))  # noqa: S307
    sizes = (2, 7, 64, 3, 5) if name == "nearest_0_5" else SIZES  # eager refuses an empty output (n = 1)
    check_sizes(cg, fn, make, sizes, atol=1e-6, rtol=1e-6)


def test_float_it_cannot_model_is_refused():
    """A float expression outside the modelled vocabulary (cos of a size) is refused with
    DynamicShapeUnsupported (kiln.compile then runs the graph's ATen form, counted), never guessed."""
    n = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.empty(5, 3)).shape[0]
    assert isinstance(sym_scalar(1.0 / torch.sym_sqrt(n)), SymScalar)
    with pytest.raises(DynamicShapeUnsupported, match="cos"):
        sym_scalar(torch._sym_cos(n) * 2.0)
