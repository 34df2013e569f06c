"""Normalizations: layer/RMS/batch/group norm, forward and backward.

Statistics are computed in fp32 for half inputs (``upcast``), like eager kernels; the mutating batch
norm overloads update running statistics with ``copy_`` (autograd's functionalization turns that
into the ``_functional`` form, which is pure).
"""

from __future__ import annotations

import torch

from .common import aten, convert, stats_dtype, upcast
from .registry import Family

FAMILY = Family("norms")
register = FAMILY.register


def _stats(x, dims, eps):
    """(mean, rstd) over ``dims`` with kept dims, biased variance."""
    var = aten.var.correction(x, dims, correction=0, keepdim=True)
    mean = aten.mean.dim(x, dims, True)
    return mean, aten.rsqrt.default(aten.add.Tensor(var, eps))


def _affine(y, weight, bias):
    if weight is not None:
        y = aten.mul.Tensor(y, weight)
    if bias is not None:
        y = aten.add.Tensor(y, bias)
    return y


@register(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axis = input.dim() - len(normalized_shape)
    dims = list(range(axis, input.dim()))
    x = upcast(input)
    mean, rstd = _stats(x, dims, eps)
    y = _affine(aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd), weight, bias)
    return convert(y, input.dtype), convert(mean, stats_dtype(input)), convert(rstd, stats_dtype(input))


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    axis = input.dim() - len(normalized_shape)
    inner = list(range(axis, input.dim()))
    outer = list(range(axis))
    n = 1
    for s in input.shape[axis:]:
        n = n * s
    x, g = upcast(input), upcast(grad_out)
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    gw = aten.mul.Tensor(g, upcast(weight)) if weight is not None else g
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        a = aten.mul.Tensor(gw, n)
        b = aten.sum.dim_IntList(gw, inner, True)
        c = aten.mul.Tensor(xhat, aten.sum.dim_IntList(aten.mul.Tensor(gw, xhat), inner, True))
        grad_input = aten.mul.Tensor(aten.div.Tensor(rstd, n), aten.sub.Tensor(aten.sub.Tensor(a, b), c))
        grad_input = convert(grad_input, input.dtype)
    if output_mask[1] and weight is not None:
        gwt = aten.mul.Tensor(g, xhat)
        grad_weight = convert(aten.sum.dim_IntList(gwt, outer, False) if outer else aten.clone.default(gwt), weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = convert(aten.sum.dim_IntList(g, outer, False) if outer else aten.clone.default(g), bias.dtype)
    return grad_input, grad_weight, grad_bias


@register(aten._fused_rms_norm.default)
def fused_rms_norm(input, normalized_shape, weight, eps):
    axis = input.dim() - len(normalized_shape)
    dims = list(range(axis, input.dim()))
    x = upcast(input)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    rstd = aten.rsqrt.default(aten.add.Tensor(aten.mean.dim(aten.mul.Tensor(x, x), dims, True), eps))
    y = aten.mul.Tensor(x, rstd)
    if weight is not None:
        y = aten.mul.Tensor(y, weight)
    return convert(y, input.dtype), rstd


@register(aten._fused_rms_norm_backward.default)
def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    axis = input.dim() - len(normalized_shape)
    inner = list(range(axis, input.dim()))
    outer = list(range(axis))
    n = 1
    for s in input.shape[axis:]:
        n = n * s
    x, g = upcast(input), upcast(grad_out)
    gw = aten.mul.Tensor(g, upcast(weight)) if weight is not None else g
    grad_input = grad_weight = None
    if output_mask[0]:
        dot = aten.sum.dim_IntList(aten.mul.Tensor(gw, x), inner, True)
        corr = aten.mul.Tensor(aten.mul.Tensor(x, aten.pow.Tensor_Scalar(rstd, 3)), aten.div.Tensor(dot, n))
        grad_input = convert(aten.sub.Tensor(aten.mul.Tensor(gw, rstd), corr), input.dtype)
    if output_mask[1] and weight is not None:
        gwt = aten.mul.Tensor(g, aten.mul.Tensor(x, rstd))
        grad_weight = convert(aten.sum.dim_IntList(gwt, outer, False) if outer else gwt, weight.dtype)
    return grad_input, grad_weight


def _channel_shape(input):
    return [1, input.shape[1]] + [1] * (input.dim() - 2)


def _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) of batch norm."""
    x = upcast(input)
    cs = _channel_shape(input)
    dims = [0] + list(range(2, input.dim()))
    new_rm = new_rv = None
    if training:
        mean, invstd = _stats(x, dims, eps)
        save_mean = aten.view.default(mean, [input.shape[1]])
        save_invstd = aten.view.default(invstd, [input.shape[1]])
        if running_mean is not None:
            n = 1
            for d in dims:
                n = n * input.shape[d]
            var = aten.var.correction(x, dims, correction=0)
            unbiased = aten.mul.Tensor(var, n / max(n - 1, 1))
            new_rm = aten.add.Tensor(aten.mul.Tensor(running_mean, 1 - momentum), aten.mul.Tensor(save_mean, momentum))
            new_rv = aten.add.Tensor(aten.mul.Tensor(running_var, 1 - momentum), aten.mul.Tensor(unbiased, momentum))
            new_rm, new_rv = convert(new_rm, running_mean.dtype), convert(new_rv, running_var.dtype)
    else:
        mean = aten.view.default(upcast(running_mean), cs)
        invstd = aten.view.default(aten.rsqrt.default(aten.add.Tensor(upcast(running_var), eps)), cs)
        save_mean = aten.full.default([0], 0, dtype=x.dtype, device=x.device)
        save_invstd = aten.full.default([0], 0, dtype=x.dtype, device=x.device)
    y = aten.mul.Tensor(aten.sub.Tensor(x, mean), invstd)
    if weight is not None:
        y = aten.mul.Tensor(y, aten.view.default(weight, cs))
    if bias is not None:
        y = aten.add.Tensor(y, aten.view.default(bias, cs))
    sd = stats_dtype(input)
    return convert(y, input.dtype), convert(save_mean, sd), convert(save_invstd, sd), new_rm, new_rv


@register(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, si, rm, rv = _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if rm is None:
        rm, rv = aten.clone.default(running_mean), aten.clone.default(running_var)
    return out, sm, si, rm, rv


def _update_stats(running_mean, running_var, rm, rv):
    if rm is not None:
        aten.copy_.default(running_mean, rm)
        aten.copy_.default(running_var, rv)


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, si, rm, rv = _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    _update_stats(running_mean, running_var, rm, rv)
    return out, sm, si


@register(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    out, sm, si, _, _ = _bn_forward(input, weight, bias, None, None, True, momentum, eps)
    return out, sm, si


@register(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, si, _, _ = _bn_forward(input, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, sm, si


@register(aten._batch_norm_with_update.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, si, rm, rv = _bn_forward(input, weight, bias, running_mean, running_var, True, momentum, eps)
    _update_stats(running_mean, running_var, rm, rv)
    return out, sm, si, aten.full.default([0], 0, dtype=torch.uint8, device=input.device)


@register(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, si, rm, rv = _bn_forward(input, weight, bias, running_mean, running_var, True, momentum, eps)
    reserve = aten.full.default([0], 0, dtype=torch.uint8, device=input.device)
    return out, sm, si, reserve, rm, rv


@register(aten._batch_norm_no_update.default)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None
    out, sm, si, _, _ = _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    reserve = aten.full.default([0], 0, dtype=torch.uint8, device=input.device)
    return out, sm, si, reserve


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    x, g = upcast(input), upcast(grad_out)
    cs = _channel_shape(input)
    dims = [0] + list(range(2, input.dim()))
    n = 1
    for d in dims:
        n = n * input.shape[d]
    if train:
        mean, invstd = upcast(save_mean), upcast(save_invstd)
    else:
        mean = upcast(running_mean)
        invstd = aten.rsqrt.default(aten.add.Tensor(upcast(running_var), eps))
    mean, invstd = aten.view.default(mean, cs), aten.view.default(invstd, cs)
    w = aten.view.default(upcast(weight), cs) if weight is not None else None
    xmu = aten.sub.Tensor(x, mean)
    sum_g = aten.sum.dim_IntList(g, dims, False)
    dot = aten.sum.dim_IntList(aten.mul.Tensor(g, xmu), dims, False)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        scale = invstd if w is None else aten.mul.Tensor(invstd, w)
        if train:
            gmean = aten.view.default(aten.div.Tensor(sum_g, n), cs)
            proj = aten.view.default(aten.mul.Tensor(aten.div.Tensor(dot, n), aten.mul.Tensor(aten.view.default(invstd, [-1]), aten.view.default(invstd, [-1]))), cs)
            gi = aten.sub.Tensor(aten.sub.Tensor(g, gmean), aten.mul.Tensor(xmu, proj))
            grad_input = aten.mul.Tensor(gi, scale)
        else:
            grad_input = aten.mul.Tensor(g, scale)
        grad_input = convert(grad_input, input.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = convert(aten.mul.Tensor(dot, aten.view.default(invstd, [-1])), weight.dtype)
    if output_mask[2]:
        grad_bias = convert(sum_g, weight.dtype if weight is not None else input.dtype)
    return grad_input, grad_weight, grad_bias


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)


@register(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve):
    train = update or running_mean is None
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask)


@register(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = upcast(input)
    xg = aten.view.default(x if x.is_contiguous() else aten.clone.default(x, memory_format=torch.contiguous_format), [N, group, -1])
    mean, rstd = _stats(xg, [2], eps)
    y = aten.view.default(aten.mul.Tensor(aten.sub.Tensor(xg, mean), rstd), list(input.shape))
    cs = _channel_shape(input)
    if weight is not None:
        y = aten.mul.Tensor(y, aten.view.default(weight, cs))
    if bias is not None:
        y = aten.add.Tensor(y, aten.view.default(bias, cs))
    sd = input.dtype  # unlike layer/batch norm, group norm saves its statistics in the input dtype on CUDA too
    return convert(y, input.dtype), convert(aten.view.default(mean, [N, group]), sd), convert(aten.view.default(rstd, [N, group]), sd)


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    x = aten.view.default(aten.clone.default(upcast(input), memory_format=torch.contiguous_format), [N, group, C // group, HxW])
    g = aten.view.default(aten.clone.default(upcast(grad_out), memory_format=torch.contiguous_format), [N, group, C // group, HxW])
    m = aten.view.default(mean, [N, group, 1, 1])
    r = aten.view.default(rstd, [N, group, 1, 1])
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, m), r)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        w = aten.view.default(upcast(weight), [1, group, C // group, 1]) if weight is not None else None
        gw = g if w is None else aten.mul.Tensor(g, w)
        n = (C // group) * HxW
        a = aten.sum.dim_IntList(gw, [2, 3], True)
        b = aten.sum.dim_IntList(aten.mul.Tensor(gw, xhat), [2, 3], True)
        gi = aten.sub.Tensor(aten.sub.Tensor(aten.mul.Tensor(gw, n), a), aten.mul.Tensor(xhat, b))
        grad_input = convert(aten.view.default(aten.mul.Tensor(gi, aten.div.Tensor(r, n)), list(input.shape)), input.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = convert(aten.view.default(aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), [0, 3], False), [C]), weight.dtype)
    if output_mask[2]:
        grad_bias = convert(aten.view.default(aten.sum.dim_IntList(g, [0, 3], False), [C]), input.dtype)
    return grad_input, grad_weight, grad_bias

