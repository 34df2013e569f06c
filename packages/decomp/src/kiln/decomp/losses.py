"""Losses: nll (1-d and 2-d), mse, l1, smooth_l1, huber, binary cross entropy; forward and backward."""

from __future__ import annotations

from .common import aten, convert, where_scalar
from .registry import Family

FAMILY = Family("losses")
register = FAMILY.register

NONE, MEAN, SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == MEAN:
        return aten.mean.dim(loss, list(range(loss.dim())), False) if loss.dim() else aten.clone.default(loss)
    if reduction == SUM:
        return aten.sum.default(loss)
    return loss


def _grad_scale(grad_output, x, reduction):
    """grad_output broadcast to the elementwise loss, divided by numel for 'mean'."""
    g = grad_output if reduction == NONE else aten.expand.default(grad_output, list(x.shape))
    if reduction == MEAN:
        g = aten.div.Tensor(g, x.numel())
    return g


def _nll_parts(self, target, weight, ignore_index, class_dim):
    """(picked -log p * w, per-element weight) with ignore_index masked to zero."""
    valid = aten.ne.Scalar(target, ignore_index)
    safe_t = where_scalar(valid, target, 0, target)
    picked = aten.squeeze.dims(aten.gather.default(self, class_dim, aten.unsqueeze.default(safe_t, class_dim)), [class_dim])
    w = aten.index.Tensor(weight, [safe_t]) if weight is not None else aten.full_like.default(picked, 1)
    w = where_scalar(valid, w, 0, w)
    return aten.mul.Tensor(aten.neg.default(picked), w), w


def _nll_forward(self, target, weight, reduction, ignore_index, class_dim):
    if self.dim() == 1 and class_dim == 1:
        class_dim = 0
    loss, w = _nll_parts(self, target, weight, ignore_index, class_dim)
    total = aten.sum.default(w)
    if reduction == NONE:
        return loss, aten.full.default([], 0, dtype=self.dtype, device=self.device)
    s = aten.sum.default(loss)
    if reduction == MEAN:
        s = aten.div.Tensor(s, total)
    return s, total


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight, class_dim):
    if self.dim() == 1 and class_dim == 1:
        class_dim = 0
    valid = aten.ne.Scalar(target, ignore_index)
    safe_t = where_scalar(valid, target, 0, target)
    w = aten.index.Tensor(weight, [safe_t]) if weight is not None else convert(valid, self.dtype)
    w = where_scalar(valid, w, 0, w)
    g = aten.mul.Tensor(aten.neg.default(w), grad_output)
    if reduction == MEAN:
        g = aten.div.Tensor(g, total_weight)
    zeros = aten.full_like.default(self, 0)
    return aten.scatter.src(zeros, class_dim, aten.unsqueeze.default(safe_t, class_dim), aten.unsqueeze.default(g, class_dim))


@register(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index, 1)


@register(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight, 1)


@register(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index, 1)


@register(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight, 1)


@register(aten.mse_loss.default)
def mse_loss(self, target, reduction=MEAN):
    d = aten.sub.Tensor(self, target)
    return _reduce(aten.mul.Tensor(d, d), reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    g = _grad_scale(grad_output, self, reduction)
    return aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(self, target), 2), g)


@register(aten.l1_loss.default)
def l1_loss(self, target, reduction=MEAN):
    return _reduce(aten.abs.default(aten.sub.Tensor(self, target)), reduction)


@register(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=MEAN, beta=1.0):
    ad = aten.abs.default(aten.sub.Tensor(self, target))
    if beta == 0:
        return _reduce(ad, reduction)
    quad = aten.div.Tensor(aten.mul.Tensor(aten.mul.Tensor(ad, ad), 0.5), beta)
    return _reduce(aten.where.self(aten.lt.Scalar(ad, beta), quad, aten.sub.Tensor(ad, 0.5 * beta)), reduction)


@register(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    d = aten.sub.Tensor(self, target)
    g = _grad_scale(grad_output, self, reduction)
    inner = aten.div.Tensor(d, beta) if beta != 0 else aten.sign.default(d)
    slope = aten.where.self(aten.lt.Scalar(aten.abs.default(d), beta), inner, aten.sign.default(d))
    return aten.mul.Tensor(slope, g)


@register(aten.huber_loss.default)
def huber_loss(self, target, reduction=MEAN, delta=1.0):
    ad = aten.abs.default(aten.sub.Tensor(self, target))
    quad = aten.mul.Tensor(aten.mul.Tensor(ad, ad), 0.5)
    lin = aten.mul.Tensor(aten.sub.Tensor(ad, 0.5 * delta), delta)
    return _reduce(aten.where.self(aten.lt.Scalar(ad, delta), quad, lin), reduction)


@register(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    d = aten.sub.Tensor(self, target)
    g = _grad_scale(grad_output, self, reduction)
    slope = aten.clamp.default(d, -delta, delta)
    return aten.mul.Tensor(slope, g)


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    log_p = aten.clamp.default(aten.log.default(self), -100)
    log_1mp = aten.clamp.default(aten.log1p.default(aten.neg.default(self)), -100)
    loss = aten.neg.default(aten.add.Tensor(aten.mul.Tensor(target, log_p),
                                            aten.mul.Tensor(aten.rsub.Scalar(target, 1), log_1mp)))
    if weight is not None:
        loss = aten.mul.Tensor(loss, weight)
    return _reduce(loss, reduction)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    eps = 1e-12
    denom = aten.clamp.default(aten.mul.Tensor(self, aten.rsub.Scalar(self, 1)), eps)
    g = aten.div.Tensor(aten.sub.Tensor(self, target), denom)
    g = aten.mul.Tensor(g, _grad_scale(grad_output, self, reduction))
    if weight is not None:
        g = aten.mul.Tensor(g, weight)
    return g


@register(aten.binary_cross_entropy_with_logits.default)
def bce_with_logits(self, target, weight=None, pos_weight=None, reduction=MEAN):
    log_sig = aten.sub.Tensor(aten.clamp.default(self, None, 0),
                              aten.log1p.default(aten.exp.default(aten.neg.default(aten.abs.default(self)))))
    log_sig_neg = aten.sub.Tensor(log_sig, self)  # log(1 - sigmoid(x))
    pos = aten.mul.Tensor(target, log_sig)
    if pos_weight is not None:
        pos = aten.mul.Tensor(pos, pos_weight)
    loss = aten.neg.default(aten.add.Tensor(pos, aten.mul.Tensor(aten.rsub.Scalar(target, 1), log_sig_neg)))
    if weight is not None:
        loss = aten.mul.Tensor(loss, weight)
    return _reduce(loss, reduction)


@register(aten.soft_margin_loss.default)
def soft_margin_loss(self, target, reduction=MEAN):
    z = aten.neg.default(aten.mul.Tensor(self, target))
    return _reduce(aten.log1p.default(aten.exp.default(z)), reduction)


