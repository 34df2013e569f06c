"""Image stems: the first convolutions of vision models, over an image's few channels, rewritten so
that cuDNN needs no workspace for them (CUDA).

Why: a workspace is an allocation ATen makes inside the call, outside kiln's memory plan. In a CUDA
graph's private pool it takes a segment beside kiln's arena (scheduler/arena.py), and for ResNet-50's
and ViT-B/16's stems that segment made the pool a quarter to a third larger than the graph's
allocated peak.

- Patch embeddings (``rewrite_patch_convs``): a convolution whose kernel equals its stride, with no
  padding, dilation, groups or transposition (ViT, DeiT, BEiT, Swin; ConvNeXt's stem) reads every
  input pixel once: it is the image cut into patches, ``[N*Ho*Wo, C*kh*kw]``, times the weight viewed
  as ``[C_out, C*kh*kw]``; a matmul on cuBLAS, the patches a buffer the memory plan places. The result
  is channels-last in memory (``[N, Ho, Wo, C_out]`` viewed as NCHW), which a vision transformer's
  flatten + transpose reads as a view.
- Channel padding (``pad_stem_channels``): cuDNN's channels-last half-precision kernels work on a
  multiple of 8 channels and pad the 3-channel image in a workspace (the image at 8 channels); with
  input and weight zero-padded to 8 channels by kiln (one fused kernel into a planned buffer, the
  same sum) it allocates nothing.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import fx

from .rewrite import node_val, replace_nodes

aten = torch.ops.aten


def _is_patch_conv(node: fx.Node, devices: tuple[str, ...]) -> bool:
    if node.target is not aten.convolution.default or len(node.args) != 9 or node.kwargs:
        return False
    x, w, _b, stride, padding, dilation, transposed, _out_pad, groups = cast(tuple[Any, ...], node.args)
    vx, vw = node_val(x), node_val(w)
    if vx is None or vw is None or vx.dim() != 4 or vx.device.type not in devices:
        return False
    if not all(isinstance(s, int) for s in (*vx.shape, *vw.shape)):
        return False
    kh, kw = vw.shape[2], vw.shape[3]
    # only stems (an image's 1-4 channels), where cuDNN's kernels pad channels in a workspace; wider
    # patch convolutions (ConvNeXt's downsampling) keep cuDNN
    return (vx.shape[1] <= 4 and not transposed and groups == 1 and list(stride) == [kh, kw] and list(padding) == [0, 0]
            and list(dilation) == [1, 1] and kh * kw > 1 and vx.shape[2] % kh == 0 and vx.shape[3] % kw == 0)


def rewrite_patch_convs(gm: fx.GraphModule, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Replace patch-embedding convolutions on ``devices`` by patches @ weight.T (+ bias); returns how
    many. New nodes have no ``meta['val']``: the caller re-propagates metadata."""
    def build(g: fx.Graph, node: fx.Node) -> fx.Node | None:
        if not _is_patch_conv(node, devices):
            return None
        x, w, b = node.args[0], node.args[1], node.args[2]
        n, c, h, wd = node_val(x).shape  # type: ignore[union-attr]
        co, _, kh, kw = node_val(w).shape  # type: ignore[union-attr]
        ho, wo = h // kh, wd // kw
        p = g.call_function(aten.reshape.default, (x, [n, c, ho, kh, wo, kw]))
        p = g.call_function(aten.permute.default, (p, [0, 2, 4, 1, 3, 5]))
        p = g.call_function(aten.clone.default, (p,), {"memory_format": torch.contiguous_format})
        p = g.call_function(aten.view.default, (p, [n * ho * wo, c * kh * kw]))
        wt = g.call_function(aten.permute.default, (g.call_function(aten.reshape.default, (w, [co, c * kh * kw])),
                                                    [1, 0]))
        y = g.call_function(aten.mm.default, (p, wt)) if b is None else g.call_function(aten.addmm.default, (b, p, wt))
        y = g.call_function(aten.view.default, (y, [n, ho, wo, co]))
        return g.call_function(aten.permute.default, (y, [0, 3, 1, 2]))
    return replace_nodes(gm, build)


def _is_narrow_channels_last_conv(node: fx.Node, devices: tuple[str, ...]) -> bool:
    if node.target is not aten.convolution.default or len(node.args) != 9 or node.kwargs:
        return False
    x, w, _b, _stride, _padding, _dilation, transposed, _out_pad, groups = node.args
    vx, vw = node_val(x), node_val(w)
    if vx is None or vw is None or vx.dim() != 4 or vx.device.type not in devices or transposed or groups != 1:
        return False
    return (vx.dtype in (torch.float16, torch.bfloat16) and vx.shape[1] % 8 != 0 and vx.shape[1] < 8
            and vx.is_contiguous(memory_format=torch.channels_last) and not vx.is_contiguous())


def pad_stem_channels(gm: fx.GraphModule, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Zero-pad the input and weight channels of channels-last half-precision stems to 8; returns
    how many. New nodes have no ``meta['val']``: the caller re-propagates metadata."""
    def build(g: fx.Graph, node: fx.Node) -> fx.Node | None:
        if not _is_narrow_channels_last_conv(node, devices):
            return None
        pad = [0, 0, 0, 0, 0, 8 - node_val(node.args[0]).shape[1]]  # type: ignore[union-attr]
        xp, wp = (g.call_function(aten.clone.default, (g.call_function(aten.constant_pad_nd.default, (t, pad)),),
                                  {"memory_format": torch.channels_last}) for t in node.args[:2])
        return g.call_function(aten.convolution.default, (xp, wp, *node.args[2:]))
    return replace_nodes(gm, build)
