"""The text that starts every generated Triton kernel module: imports and small jit helpers.

The module is plain source (saved in artifacts as text); it needs only triton and numpy. Under the
Triton interpreter (``TRITON_INTERPRET=1``, how CI runs kernels on CPU tensors) libdevice calls have no
implementation, so the module binds ``libdevice`` to a numpy shim there instead. The branch asks triton's
knob when the module is imported (compile workers import the same text without the interpreter), so no
environment is read here.
"""

from __future__ import annotations

PRELUDE = '''\
# kiln.inductor generated Triton kernels
import math

import triton
import triton.language as tl
from triton import knobs as _triton_knobs

if _triton_knobs.runtime.interpret:  # triton's own reading of TRITON_INTERPRET, as its JIT decides
    import numpy as _np
    from triton.runtime.interpreter import TensorHandle as _TensorHandle

    def _interp(fn):
        def call(*args):
            ref = next(a for a in args if isinstance(a, tl.tensor))
            datas = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
            with _np.errstate(all="ignore"):
                out = _np.asarray(fn(*datas)).astype(ref.handle.data.dtype)
            ty = tl.block_type(ref.dtype, list(out.shape)) if out.ndim else ref.dtype
            return tl.tensor(_TensorHandle(out, ref.dtype), ty)
        return call

    def _vec(f):
        return _np.vectorize(f, otypes=[_np.float64])

    class libdevice:  # noqa: N801 - stands in for triton.language.extra.libdevice
        expm1 = staticmethod(_interp(_np.expm1))
        log10 = staticmethod(_interp(_np.log10))
        log1p = staticmethod(_interp(_np.log1p))
        rsqrt = staticmethod(_interp(lambda x: 1.0 / _np.sqrt(x)))
        tan = staticmethod(_interp(_np.tan))
        asin = staticmethod(_interp(_np.arcsin))
        acos = staticmethod(_interp(_np.arccos))
        atan = staticmethod(_interp(_np.arctan))
        sinh = staticmethod(_interp(_np.sinh))
        cosh = staticmethod(_interp(_np.cosh))
        tanh = staticmethod(_interp(_np.tanh))
        asinh = staticmethod(_interp(_np.arcsinh))
        acosh = staticmethod(_interp(_np.arccosh))
        atanh = staticmethod(_interp(_np.arctanh))
        erfc = staticmethod(_interp(_vec(math.erfc)))
        lgamma = staticmethod(_interp(_vec(lambda v: math.lgamma(v) if v not in (0.0, -0.0) and not (
            v < 0 and v == int(v)) else float("inf"))))
        trunc = staticmethod(_interp(_np.trunc))
        nearbyint = staticmethod(_interp(_np.rint))
        fmod = staticmethod(_interp(_np.fmod))
        pow = staticmethod(_interp(_np.power))
        atan2 = staticmethod(_interp(_np.arctan2))
        copysign = staticmethod(_interp(_np.copysign))
        hypot = staticmethod(_interp(_np.hypot))

    @triton.jit
    def _kiln_round_bf16(x):
        # the interpreter truncates fp32 -> bf16; round to nearest even by hand, as the GPU's cvt.rn does
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
else:
    from triton.language.extra import libdevice

    @triton.jit
    def _kiln_round_bf16(x):
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _kiln_python_mod(r, y):
    # C remainder -> Python/torch remainder (takes the divisor's sign)
    return tl.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@triton.jit
def _kiln_floordiv_float(a, b):
    # torch's div_floor, from the same fmod as a % b: floor(a / b) rounds the quotient first
    # (1.0 // 0.1 is 9 in torch, floor(1.0 / 0.1) is 10) and gives inf // 2 = inf, -1 // inf = -0
    q = a / b
    m = libdevice.fmod(a, b)
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = tl.floor(d)
    f = tl.where(d - f > 0.5, f + 1, f)
    f = tl.where(d == 0, libdevice.copysign(tl.zeros_like(q), q), f)
    return tl.where(b == 0, q, f)


@triton.jit
def _kiln_ipow(a, b, BITS: tl.constexpr):
    # integer pow by squaring in the integer type, wrapping on overflow as eager does (through float64
    # it was inexact past 2**53 and saturated on overflow); a negative exponent gives 1, -1 or 0 as in C
    r = tl.zeros_like(a) + 1
    base = a
    e = b
    for _ in tl.static_range(BITS):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    neg = tl.where(a == 1, 1, tl.where(a + 1 == 0, 1 - 2 * (b & 1), 0))  # a + 1 == 0: no negative literal for uint8
    return tl.where(b < 0, neg.to(r.dtype), r)


@triton.jit
def _kiln_max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _kiln_min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _kiln_sum_combine(a, b):
    return a + b


@triton.jit
def _kiln_prod_combine(a, b):
    return a * b


@triton.jit
def _kiln_argmax_combine(va, ia, vb, ib):
    # the larger value wins (NaN counts as largest); ties go to the first index
    a_nan = va != va
    b_nan = vb != vb
    gt = (va > vb) | (a_nan & ~b_nan)
    eq = (va == vb) | (a_nan & b_nan)
    pick_a = gt | (eq & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)


@triton.jit
def _kiln_argmin_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    lt = (va < vb) | (a_nan & ~b_nan)
    eq = (va == vb) | (a_nan & b_nan)
    pick_a = lt | (eq & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)
'''
