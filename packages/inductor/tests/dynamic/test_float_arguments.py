"""Float arguments that vary (kiln.capture's float symbols ``zf0``...: a learning rate, a scale) as
kernel arguments: a graph with a SymFloat placeholder compiles once, its kernels take the value as a
double (C++) or an unspecialised ``fp64`` (Triton), and every call with a fresh value equals eager --
through the Python wrapper on the C++ path and the Triton interpreter, and the C++ wrapper."""

from __future__ import annotations

import pytest
import torch
from dynamic_helpers import BACKENDS, CPP
from torch._dynamo.source import ConstantSource  # tests only: a named source for the symbol
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.graph import symbolic_dispatch
from kiln.inductor import compile_graph
from kiln.inductor.ir import ExternKernel

torch.manual_seed(0)
VALUES = (0.5, 1 / 3, -2.75, 1e-3, 7.0, 0.1)


def _graph(fn, x: torch.Tensor, value: float):
    """``fn(x, f)`` traced with ``f`` a float symbol (as kiln.capture lifts a float that changed)."""
    env = ShapeEnv()
    sym = env.create_unspecified_symbol(value, ConstantSource("f"), dynamic_dim=DimDynamic.DYNAMIC)
    f = env.create_symfloatnode(sym, hint=value, source=ConstantSource("f"))
    mode = FakeTensorMode(shape_env=env)
    fx_ = mode.from_tensor(x, static_shapes=True)
    with mode, symbolic_dispatch(True):
        gm = make_fx(fn, tracing_mode="real")(fx_, f)
    return gm, [fx_, f], sym.name


OPS = {
    "mul": lambda x, f: (torch.ops.aten.mul.Tensor(x, f),),
    "add_alpha": lambda x, f: (torch.ops.aten.add.Tensor(x, x.cos(), alpha=-f),),
    "clamp_min": lambda x, f: (torch.ops.aten.clamp.default(x, f),),
    "pow": lambda x, f: (torch.ops.aten.pow.Tensor_Scalar(x.abs(), f),),
    "full": lambda x, f: (torch.ops.aten.add.Tensor(torch.ops.aten.full.default([x.shape[1]], f), x),),
    "float_math": lambda x, f: (torch.ops.aten.mul.Tensor(x, 1.0 - f * 0.25),),
}


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_float_argument_is_a_kernel_argument(options, name):
    fn = OPS[name]
    x = torch.randn(4, 5)
    gm, examples, symbol = _graph(fn, x, 0.5)
    cg = compile_graph(gm, examples, options=options)
    assert cg.backend == "inductor"
    assert not [n for n in cg.loop_program.nodes if isinstance(n, ExternKernel)]  # no ATen
    assert cg.size_sources[symbol] == "arg1"
    code = "\n".join(cg.texts.values())
    assert f"const double {symbol}" in code or f'{symbol}: "fp64"' in code, code
    for f in VALUES:
        x = torch.randn(4, 5)
        want = fn(x, f)[0]
        got = cg.fn(x, f)[0]
        torch.testing.assert_close(got, want, msg=lambda m, f=f: f"value {f}: {m}")
        if name in ("mul", "clamp_min", "full", "float_math"):  # no libm call: the bits eager computes
            assert torch.equal(got, want), f"value {f}"


def test_float_argument_in_the_cpp_wrapper():
    """wrapper='cpp': the float's IEEE bits travel in the library's int64 size array, read as a double."""
    fn = OPS["float_math"]
    gm, examples, symbol = _graph(fn, torch.randn(4, 5), 0.5)
    cg = compile_graph(gm, examples, options=CPP.replace(wrapper="cpp"))
    assert cg.backend == "inductor(cpp wrapper)", cg.backend
    assert f"const double {symbol} = kiln_double_of_bits(sizes[" in cg.texts["cpp_wrapper"]
    for f in VALUES:
        x = torch.randn(4, 5)
        assert torch.equal(cg.fn(x, f)[0], fn(x, f)[0]), f
