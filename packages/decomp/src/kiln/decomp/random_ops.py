"""Random ops: dropout (forward and backward) on ``rand`` + compare, so RNG stays one core op."""

from __future__ import annotations

import torch

from .common import aten, convert
from .registry import Family

FAMILY = Family("random_ops")
register = FAMILY.register


@register(aten.native_dropout.default)
def native_dropout(input, p, train):
    if not train or p == 0:
        return aten.clone.default(input), aten.full.default(list(input.shape), 1, dtype=torch.bool, device=input.device)
    if p >= 1:
        return aten.full_like.default(input, 0), aten.full.default(list(input.shape), 0, dtype=torch.bool, device=input.device)
    keep = aten.lt.Scalar(aten.rand.default(list(input.shape), dtype=torch.float32, device=input.device), 1 - p)
    out = aten.mul.Tensor(aten.mul.Tensor(input, keep), 1.0 / (1 - p))
    return out, keep


@register(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return aten.mul.Tensor(aten.mul.Tensor(grad_output, convert(mask, grad_output.dtype)), scale)
