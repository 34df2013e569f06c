"""Every op of the loop IR's OPS vocabulary, generated as a Triton kernel and compared with eager."""

import math

import pytest
import torch

from kiln.inductor.codegen.triton import EMITTERS
from kiln.inductor.codegen.triton.testing import device, kernel, load, node, run, strided, xs
from kiln.inductor.ir import OPS, Constant, IndexValue, cast, op

F32, I64, I32, B = torch.float32, torch.int64, torch.int32, torch.bool
N = 200


def test_every_op_has_an_emitter():
    assert set(OPS) <= set(EMITTERS), sorted(set(OPS) - set(EMITTERS))


def _f(lo=-3.0, hi=3.0):
    return lambda g: torch.rand(N, generator=g) * (hi - lo) + lo


def _i(lo=-20, hi=20):
    return lambda g: torch.randint(lo, hi, (N,), generator=g)


def _nz_i(g):
    v = torch.randint(-9, 9, (N,), generator=g)
    return torch.where(v == 0, torch.ones_like(v), v)


def _b(g):
    return torch.rand(N, generator=g) > 0.5


def _specials(g):
    v = torch.randn(N, generator=g)
    v[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    return v


# name -> (operand dtype, output dtype, operand generators, eager reference)
UNARY_MATH = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "erf": torch.erf, "erfc": torch.erfc, "sigmoid": torch.sigmoid,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round, "frac": torch.frac,
}
POSITIVE_MATH = {"log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p,
                 "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
                 "lgamma": torch.lgamma}
CASES: dict[str, tuple] = {}
for _n, _fn in UNARY_MATH.items():
    CASES[_n] = (F32, F32, [_f()], _fn)
for _n, _fn in POSITIVE_MATH.items():
    CASES[_n] = (F32, F32, [_f(0.05, 5.0)], _fn)
CASES.update({
    "asin": (F32, F32, [_f(-0.99, 0.99)], torch.asin), "acos": (F32, F32, [_f(-0.99, 0.99)], torch.acos),
    "atanh": (F32, F32, [_f(-0.95, 0.95)], torch.atanh), "acosh": (F32, F32, [_f(1.0, 5.0)], torch.acosh),
    "pow": (F32, F32, [_f(0.1, 3.0), _f(-2.0, 2.0)], torch.pow),
    "atan2": (F32, F32, [_f(), _f()], torch.atan2), "hypot": (F32, F32, [_f(), _f()], torch.hypot), "copysign": (F32, F32, [_f(), _f()], torch.copysign),
    "neg": (F32, F32, [_f()], torch.neg), "abs": (I64, I64, [_i()], torch.abs),
    "sign": (F32, F32, [_specials], torch.sign), "square": (I32, I32, [_i()], torch.square),
    "relu": (F32, F32, [_specials], torch.relu),
    "add": (I64, I64, [_i(), _i()], torch.add), "sub": (F32, F32, [_f(), _f()], torch.sub),
    "mul": (I32, I32, [_i(), _i()], torch.mul), "truediv": (F32, F32, [_f(), _f(0.5, 2.0)], torch.div),
    "floordiv": (I64, I64, [_i(), _nz_i], lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "truncdiv": (I64, I64, [_i(), _nz_i], lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    "mod": (I64, I64, [_i(), _nz_i], torch.remainder), "fmod": (I64, I64, [_i(), _nz_i], torch.fmod),
    "maximum": (F32, F32, [_specials, _f()], torch.maximum), "minimum": (F32, F32, [_specials, _f()], torch.minimum),
    "eq": (I64, B, [_i(-2, 2), _i(-2, 2)], torch.eq), "ne": (I64, B, [_i(-2, 2), _i(-2, 2)], torch.ne),
    "lt": (F32, B, [_f(), _f()], torch.lt), "le": (I64, B, [_i(-2, 2), _i(-2, 2)], torch.le),
    "gt": (F32, B, [_f(), _f()], torch.gt), "ge": (I64, B, [_i(-2, 2), _i(-2, 2)], torch.ge),
    "isnan": (F32, B, [_specials], torch.isnan), "isinf": (F32, B, [_specials], torch.isinf),
    "isfinite": (F32, B, [_specials], torch.isfinite),
    "logical_and": (B, B, [_b, _b], torch.logical_and), "logical_or": (B, B, [_b, _b], torch.logical_or),
    "logical_xor": (B, B, [_b, _b], torch.logical_xor), "logical_not": (B, B, [_b], torch.logical_not),
    "bitwise_and": (I64, I64, [_i(), _i()], torch.bitwise_and),
    "bitwise_or": (I32, I32, [_i(), _i()], torch.bitwise_or),
    "bitwise_xor": (I64, I64, [_i(), _i()], torch.bitwise_xor),
    "lshift": (I64, I64, [_i(), _i(0, 8)], torch.bitwise_left_shift),
    "rshift": (I64, I64, [_i(-1000, 1000), _i(0, 8)], torch.bitwise_right_shift),
    "bitwise_not": (I64, I64, [_i()], torch.bitwise_not),
    # an index in range of a dim of size 7, negative ones from the end (out of range: the C++ tests)
    "check_index": (I64, I64, [_i(-7, 7), lambda g: torch.full((N,), 7)], lambda i, n: torch.where(i < 0, i + n, i)),
    "check_index_nonneg": (I64, I64, [_i(0, 7), lambda g: torch.full((N,), 7)], lambda i, n: i),
})


@pytest.mark.parametrize("name", sorted(n for n in OPS if OPS[n].kind not in ("select", "random")))
def test_op_matches_eager(name):
    dt, out_dt, gens, ref = CASES[name]
    g = torch.Generator().manual_seed(hash(name) % 1000)
    dev = device()
    ins = {f"in{i}": gen(g).to(dt).to(dev) for i, gen in enumerate(gens)}
    (x0,) = xs(1)
    body = op(name, *(load(b, [x0], t) for b, t in ins.items()), dtype=out_dt)
    out = torch.empty(N, dtype=out_dt, device=dev)
    run([kernel(f"k_{name}", [N], [], [node("out", body, x0)])], {**ins, "out": out})
    expected = ref(*ins.values())
    if out_dt.is_floating_point:
        torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5, equal_nan=True)
    else:
        assert torch.equal(out, expected), (out, expected)


def test_where_constant_and_cast():
    dev = device()
    a = torch.randn(N, device=dev)
    (x0,) = xs(1)
    la = load("a", [x0], a)
    cond = op("gt", la, Constant(0.0, F32), dtype=B)
    body = op("where", cond, cast(op("mul", la, Constant(2.0, F32), dtype=F32), torch.float64),
              Constant(-1.5, torch.float64), dtype=torch.float64)
    out = torch.empty(N, dtype=torch.float64, device=dev)
    run([kernel("k_where", [N], [], [node("out", body, x0)])], {"a": a, "out": out})
    torch.testing.assert_close(out, torch.where(a > 0, a.double() * 2, -1.5))


def test_index_value_is_iota():
    dev = device()
    (x0, x1) = xs(2)
    body = cast(op("add", IndexValue(x0 * 7, I64), IndexValue(x1, I64), dtype=I64), F32)
    out = torch.empty(5, 7, device=dev)
    run([kernel("k_iota", [5, 7], [], [node("out", body, strided([x0, x1], out))])], {"out": out})
    torch.testing.assert_close(out, torch.arange(35, dtype=F32, device=dev).view(5, 7))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_half_loaded_and_computed_in_fp32(dt):
    dev = device()
    a = torch.randn(N, device=dev).to(dt)
    b = torch.randn(N, device=dev).to(dt)
    (x0,) = xs(1)
    body = cast(op("add", op("exp", cast(load("a", [x0], a), F32), dtype=F32), cast(load("b", [x0], b), F32),
                   dtype=F32), dt)
    out = torch.empty(N, dtype=dt, device=dev)
    tk = run([kernel("k_half", [N], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    assert ".to(tl.float32)" in tk.source
    torch.testing.assert_close(out, (a.float().exp() + b.float()).to(dt))


def test_integer_casts_truncate_like_torch():
    dev = device()
    a = torch.tensor([-2.7, -0.5, 0.4, 3.9, 300.2], device=dev)
    (x0,) = xs(1)
    out = torch.empty(5, dtype=torch.int32, device=dev)
    run([kernel("k_cast", [5], [], [node("out", cast(load("a", [x0], a), torch.int32), x0)])], {"a": a, "out": out})
    assert torch.equal(out, a.to(torch.int32))
    assert math.isfinite(float(a.sum()))


def test_float_floordiv_is_torchs_div_floor():
    # torch floors from fmod, not from the rounded quotient: 1.0 // 0.1 is 9 (floor(1.0 / 0.1) is 10),
    # inf // 2 is NaN, -1 // inf is -1, and a zero quotient keeps its sign
    dev = device()
    a = torch.tensor([1.0, 7.0, -1.0, float("inf"), -1.0, 5.0, -0.0, 0.0, 3.0, -3.0, 0.3], device=dev)
    b = torch.tensor([0.1, 0.7, 0.1, 2.0, float("inf"), -float("inf"), 2.0, -2.0, 0.0, 0.0, -0.1], device=dev)
    (x0,) = xs(1)
    body = op("floordiv", load("a", [x0], a), load("b", [x0], b), dtype=F32)
    out = torch.empty(a.numel(), device=dev)
    run([kernel("k_floordiv", [a.numel()], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    expected = torch.div(a, b, rounding_mode="floor")
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(out.signbit(), expected.signbit())


def test_bool_add_is_logical_or():
    # torch: True + True is True; Triton's int1 add wraps to False
    dev = device()
    a = torch.tensor([True, True, False, False], device=dev)
    b = torch.tensor([True, False, True, False], device=dev)
    (x0,) = xs(1)
    body = op("add", load("a", [x0], a), load("b", [x0], b), dtype=B)
    out = torch.empty(4, dtype=B, device=dev)
    run([kernel("k_bool_add", [4], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    assert torch.equal(out, a + b), out


@pytest.mark.parametrize("dt", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_pow_is_exact_and_wraps(dt):
    # by squaring in the integer type, as eager: through float, 3 ** 39 was inexact and overflow saturated
    dev = device()
    g = torch.Generator().manual_seed(0)
    lo = 0 if dt == torch.uint8 else -9
    a = torch.randint(lo, 9, (N,), generator=g).to(dt).to(dev)
    b = torch.randint(0, 64, (N,), generator=g).to(dt).to(dev)
    (x0,) = xs(1)
    body = op("pow", load("a", [x0], a), load("b", [x0], b), dtype=dt)
    out = torch.empty(N, dtype=dt, device=dev)
    run([kernel("k_ipow", [N], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    assert torch.equal(out, a ** b), (out, a ** b)


@pytest.mark.parametrize("dt", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("name", ["lshift", "rshift"])
def test_shift_counts_out_of_range_shift_everything_out(name, dt):
    # torch: a count outside [0, bits) gives 0 for << and the sign for >> (undefined in LLVM)
    dev = device()
    g = torch.Generator().manual_seed(0)
    lo = 0 if dt == torch.uint8 else -100
    a = torch.randint(lo, 100, (N,), generator=g).to(dt).to(dev)
    b = torch.randint(lo // 50, 72 if dt != torch.int8 else 100, (N,), generator=g).to(dt).to(dev)
    (x0,) = xs(1)
    body = op(name, load("a", [x0], a), load("b", [x0], b), dtype=dt)
    out = torch.empty(N, dtype=dt, device=dev)
    run([kernel(f"k_{name}", [N], [], [node("out", body, x0)])], {"a": a, "b": b, "out": out})
    expected = a << b if name == "lshift" else a >> b
    assert torch.equal(out, expected), (out, expected)


def test_integer_constants_wrap_into_their_dtype():
    # eager converts a scalar by wrapping: uint8 x + -3 adds 253 (Triton rejected -3 as a uint8 constant)
    dev = device()
    a = torch.arange(0, 250, 5, dtype=torch.uint8, device=dev)
    (x0,) = xs(1)
    u8 = torch.uint8
    body = op("add", load("a", [x0], a), Constant(-3, u8), dtype=u8)
    out = torch.empty(a.numel(), dtype=u8, device=dev)
    run([kernel("k_wrap", [a.numel()], [], [node("out", body, x0)])], {"a": a, "out": out})
    assert torch.equal(out, a + (-3)), out
