"""The ``inductor`` table's performance rewrites (on top of every core rule).

Each rule turns a core op into cheaper core ops in a case a code generator handles better as
pointwise/reduction work than as a library call or a transcendental, and returns ``NotImplemented``
(the op stays) otherwise.
"""

from __future__ import annotations

from .common import aten
from .registry import Family

FAMILY = Family("inductor_rewrites")
register = FAMILY.register

SMALL_GEMM = 1  # a matmul whose inner or outer size is this small is a broadcast multiply


@register(aten.pow.Tensor_Scalar, table="inductor")
def pow_tensor_scalar(self, exponent):
    # pow is a transcendental; small integer and half exponents are cheaper as mul/sqrt/reciprocal
    if not self.dtype.is_floating_point or isinstance(exponent, bool):
        return NotImplemented
    if exponent == 2:
        return aten.mul.Tensor(self, self)
    if exponent == 3:
        return aten.mul.Tensor(aten.mul.Tensor(self, self), self)
    if exponent == 0.5:
        return aten.sqrt.default(self)
    if exponent == -0.5:
        return aten.rsqrt.default(self)
    if exponent == -1:
        return aten.reciprocal.default(self)
    if exponent == 1:
        return aten.clone.default(self)
    return NotImplemented


@register(aten.mm.default, table="inductor")
def mm(self, mat2):
    # K == 1 is an outer product and M == 1 a vector-matrix product: pointwise (+ one reduction)
    if self.shape[1] == SMALL_GEMM:
        return aten.mul.Tensor(self, mat2)
    if self.shape[0] == SMALL_GEMM and self.dtype.is_floating_point:
        return aten.sum.dim_IntList(aten.mul.Tensor(aten.permute.default(self, [1, 0]), mat2), [0], True)
    return NotImplemented


@register(aten.bmm.default, table="inductor")
def bmm(self, mat2):
    if self.shape[2] == SMALL_GEMM:
        return aten.mul.Tensor(self, mat2)
    return NotImplemented


@register(aten.addmm.default, table="inductor")
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if mat1.shape[1] != SMALL_GEMM and mat1.shape[0] != SMALL_GEMM:
        return NotImplemented
    prod = mm(mat1, mat2)
    if alpha != 1:
        prod = aten.mul.Tensor(prod, alpha)
    if beta == 0:
        return prod
    return aten.add.Tensor(prod, self if beta == 1 else aten.mul.Tensor(self, beta))


@register(aten.cat.default, table="inductor")
def cat(tensors, dim=0):
    nonempty = [t for t in tensors if t.numel() != 0 or t.dim() != 1]
    if len(nonempty) == 1 and len(tensors) > 1:
        return aten.clone.default(nonempty[0])
    return NotImplemented
