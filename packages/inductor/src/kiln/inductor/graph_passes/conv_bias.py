"""Convolution bias as a pointwise add that the convolution's consumer fuses (Triton backend).

Why: ATen's cuDNN convolution adds its bias in a separate elementwise kernel after the convolution
(``_convolution`` runs ``output.add_(bias.reshape(...))``): ConvNeXt-T ran 21 of them per step on the
H200, 0.2 of 2.3 ms of kernel time. Called without its bias, the convolution leaves the add to kiln:
``convolution(x, w, None) + bias.view(C, 1, ..)``, a small pointwise value the scheduler inlines into
the generated kernel that reads the convolution's output (LayerNorm, residual add, activation,
BatchNorm), as torch.compile does. The broadcast is over dim 1 of the output (output channels, for
transposed and grouped convolutions too), whatever its memory layout: the add reads the extern's
output with its strides (channels-last included).

Only convolutions read (through views) by a generated kernel and by no extern are rewritten. A
convolution whose output is also a graph output (a training forward's saved activation) gets its biased
output stored by that kernel, as a second store: still no kernel of its own. One whose output only
goes out of the graph or into another extern keeps its bias: the biased value must be stored before
anything reads it, and ATen stores it no worse (an in-place add, or inside its native depthwise and CPU
kernels).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.graph import target_name

from ..lowering.extern import RULES as EXTERN_RULES
from ..lowering.registry import LOWERINGS
from ..lowering.views import RULES as VIEW_RULES
from .rewrite import node_val, replace_nodes

aten = torch.ops.aten


def _consumers(node: fx.Node) -> set[str]:
    """What reads ``node`` (through views): "kernel" (an op kiln lowers to a generated kernel), "output",
    "extern" (an extern or ATen fallback)."""
    kinds: set[str] = set()
    for u in node.users:
        name = target_name(u.target) if u.op == "call_function" else ""
        if u.op == "output":
            kinds.add("output")
        elif u.target is operator.getitem or name in VIEW_RULES:
            kinds |= _consumers(u)
        else:
            kinds.add("extern" if u.op != "call_function" or name in EXTERN_RULES or name not in LOWERINGS
                      else "kernel")
    return kinds


def _splittable(node: fx.Node, devices: tuple[str, ...]) -> bool:
    if node.target is not aten.convolution.default or len(node.args) != 9 or node.kwargs:
        return False
    bias, out = node_val(node.args[2]), node_val(node)
    if bias is None or out is None or out.device.type not in devices or out.dim() < 3:
        return False
    kinds = _consumers(node)
    return bias.dim() == 1 and bias.dtype == out.dtype and "kernel" in kinds and "extern" not in kinds


def split_conv_bias(gm: fx.GraphModule, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Rewrite ``convolution(x, w, b, ...)`` on ``devices`` as ``convolution(x, w, None, ...) + b.view(C, 1, ..)``
    where the add fuses into the consumers; returns how many. New nodes have no ``meta['val']``: the
    caller re-propagates metadata."""
    def build(g: fx.Graph, node: fx.Node) -> fx.Node | None:
        if not _splittable(node, devices):
            return None
        x, w, b, *rest = node.args
        conv = g.call_function(aten.convolution.default, (x, w, None, *rest))
        ones = [1] * (node_val(node).dim() - 2)  # type: ignore[union-attr]
        bias = g.call_function(aten.view.default, (b, [-1, *ones]))
        return g.call_function(aten.add.Tensor, (conv, bias))
    return replace_nodes(gm, build)
