"""Upsampling: nearest and bilinear 2-d, forward and backward, as index arithmetic + gathers."""

from __future__ import annotations

import torch

from .common import arange, aten, convert
from .registry import Family

FAMILY = Family("upsample")
register = FAMILY.register


def _scale(n_in, n_out, scale, align_corners=False):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _nearest_index(n_in, n_out, scale, like):
    s = _scale(n_in, n_out, scale)
    src = aten.mul.Tensor(arange(n_out, like, torch.float32), s)
    idx = convert(aten.floor.default(src), torch.int64)
    return aten.clamp.default(idx, None, n_in - 1)


def _out_size(input, output_size, scale_factors):
    if output_size is not None:
        return list(output_size)
    return [int(input.shape[-2] * scale_factors[0]), int(input.shape[-1] * scale_factors[1])]


@register(aten.upsample_nearest2d.default)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    oh, ow = output_size
    ih = _nearest_index(self.shape[-2], oh, scales_h, self)
    iw = _nearest_index(self.shape[-1], ow, scales_w, self)
    lead = [None] * (self.dim() - 2)
    return aten.index.Tensor(self, lead + [aten.unsqueeze.default(ih, 1), iw])


@register(aten.upsample_nearest2d.vec)
def upsample_nearest2d_vec(input, output_size, scale_factors):
    size = _out_size(input, output_size, scale_factors)
    sh, sw = scale_factors if scale_factors is not None else (None, None)
    return upsample_nearest2d(input, size, sh, sw)


@register(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    oh, ow = output_size
    ih = _nearest_index(input_size[-2], oh, scales_h, grad_output)
    iw = _nearest_index(input_size[-1], ow, scales_w, grad_output)
    zeros = aten.full.default(list(input_size), 0, dtype=grad_output.dtype, device=grad_output.device)
    lead = [None] * (len(input_size) - 2)
    return aten.index_put.default(zeros, lead + [aten.unsqueeze.default(ih, 1), iw], grad_output, True)


def _linear_coords(n_in, n_out, align_corners, scale, like):
    """(i0, i1, w1) per output position for 1-d linear interpolation."""
    s = _scale(n_in, n_out, scale, align_corners)
    o = arange(n_out, like, torch.float64 if like.dtype == torch.float64 else torch.float32)
    if align_corners:
        src = aten.mul.Tensor(o, s)
    else:
        src = aten.clamp.default(aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(o, 0.5), s), 0.5), 0)
    i0 = aten.clamp.default(convert(aten.floor.default(src), torch.int64), None, n_in - 1)
    i1 = aten.clamp.default(aten.add.Tensor(i0, 1), None, n_in - 1)
    w1 = aten.clamp.default(aten.sub.Tensor(src, i0), 0, 1)
    return i0, i1, w1


@register(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    oh, ow = output_size
    h0, h1, wh = _linear_coords(self.shape[-2], oh, align_corners, scales_h, self)
    w0, w1, ww = _linear_coords(self.shape[-1], ow, align_corners, scales_w, self)
    lead = [None] * (self.dim() - 2)
    x = self if self.dtype in (torch.float32, torch.float64) else convert(self, torch.float32)
    col = lambda t: aten.unsqueeze.default(t, 1)  # noqa: E731
    tl = aten.index.Tensor(x, lead + [col(h0), w0])
    tr = aten.index.Tensor(x, lead + [col(h0), w1])
    bl = aten.index.Tensor(x, lead + [col(h1), w0])
    br = aten.index.Tensor(x, lead + [col(h1), w1])
    wh_, ww_ = convert(col(wh), x.dtype), convert(ww, x.dtype)
    top = aten.add.Tensor(tl, aten.mul.Tensor(aten.sub.Tensor(tr, tl), ww_))
    bot = aten.add.Tensor(bl, aten.mul.Tensor(aten.sub.Tensor(br, bl), ww_))
    return convert(aten.add.Tensor(top, aten.mul.Tensor(aten.sub.Tensor(bot, top), wh_)), self.dtype)


@register(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d_vec(input, output_size, align_corners, scale_factors):
    size = _out_size(input, output_size, scale_factors)
    sh, sw = scale_factors if scale_factors is not None else (None, None)
    return upsample_bilinear2d(input, size, align_corners, sh, sw)


@register(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    oh, ow = output_size
    g = grad_output
    h0, h1, wh = _linear_coords(input_size[-2], oh, align_corners, scales_h, g)
    w0, w1, ww = _linear_coords(input_size[-1], ow, align_corners, scales_w, g)
    lead = [None] * (len(input_size) - 2)
    col = lambda t: aten.unsqueeze.default(t, 1)  # noqa: E731
    wh_, ww_ = convert(col(wh), g.dtype), convert(ww, g.dtype)
    one_h, one_w = aten.rsub.Scalar(wh_, 1), aten.rsub.Scalar(ww_, 1)
    out = aten.full.default(list(input_size), 0, dtype=g.dtype, device=g.device)
    for hi, hw in ((h0, one_h), (h1, wh_)):
        for wi, wwt in ((w0, one_w), (w1, ww_)):
            out = aten.index_put.default(out, lead + [col(hi), wi], aten.mul.Tensor(g, aten.mul.Tensor(hw, wwt)), True)
    return out
