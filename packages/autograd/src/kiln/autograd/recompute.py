"""Joint-graph rewrites that let the partitioner recompute instead of save (run before partitioning).

Training BatchNorm is one op returning the normalized output and the batch statistics. The min-cut
may not recompute it (it reduces over the batch), so every value computed from its output, the ReLU
after it above all, had to be saved for the backward: in ResNet-50 each BatchNorm's input (which its
own backward reads anyway) and the ReLU output after it were both saved, 586 MB of ReLU outputs at
batch 32. ``expose_batch_norm_outputs`` writes the normalized output as the pointwise expression it
is, ``(x - mean) * invstd * weight + bias`` over the op's own statistics; the op stays for the
statistics (and the running-stat updates), its output is no longer read. The partitioner can then
rebuild the ReLU output in the backward from tensors it saves anyway (x, mean, invstd) and the
parameters, as torch inductor's partitioner does over its decomposed BatchNorm.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

aten = torch.ops.aten
# BatchNorm ops whose outputs are (normalized, mean, invstd, ...) -> position of their training flag
# (None: always training)
_TRAINING_BN: dict[Any, int | None] = {
    aten._native_batch_norm_legit_functional.default: 5,  # (x, w, b, rm, rv, training, momentum, eps)
    aten._native_batch_norm_legit.no_stats: 3,  # (x, w, b, training, momentum, eps)
}
if hasattr(aten, "_batch_norm_with_update_functional"):  # (x, w, b, rm, rv, momentum, eps)
    _TRAINING_BN[aten._batch_norm_with_update_functional.default] = None


def expose_batch_norm_outputs(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` in place (see the module doc); returns how many BatchNorm outputs were rewritten."""
    rewritten = 0
    order = {m: k for k, m in enumerate(gm.graph.nodes)}
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _TRAINING_BN:
            continue
        flag = _TRAINING_BN[n.target]
        if flag is not None and n.args[flag] is not True:
            continue
        out = next((u for u in n.users if u.target is operator.getitem and u.args[1] == 0), None)
        x = n.args[0]
        xv = x.meta.get("val") if isinstance(x, fx.Node) else None
        if out is None or not out.users or not isinstance(xv, FakeTensor) or xv.dim() < 2:
            continue
        with gm.graph.inserting_before(min(out.users, key=lambda u: order[u])):
            y = _normalize(gm, x, xv, _getitem(gm, n, 1), _getitem(gm, n, 2), n.args[1], n.args[2])
        out.replace_all_uses_with(y)
        gm.graph.erase_node(out)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _getitem(gm: fx.GraphModule, n: fx.Node, k: int) -> fx.Node:
    g = gm.graph.call_function(operator.getitem, (n, k))
    g.meta["val"] = n.meta["val"][k]
    return g


def _call(gm: fx.GraphModule, target: Any, args: tuple, kwargs: dict | None = None) -> fx.Node:
    """A new node with its fake value (the partitioner weighs nodes by their bytes)."""
    node = gm.graph.call_function(target, args, kwargs or {})
    vals = fx.node.map_arg((args, kwargs or {}), lambda a: a.meta["val"])
    mode = next(v.fake_mode for v in _fakes(vals))
    with mode:
        node.meta["val"] = target(*vals[0], **vals[1])
    return node


def _fakes(vals: Any) -> list[FakeTensor]:
    return [v for v in torch.utils._pytree.tree_leaves(vals) if isinstance(v, FakeTensor)]


def _normalize(gm: fx.GraphModule, x: fx.Node, xv: FakeTensor, mean: fx.Node, invstd: fx.Node,
               weight: Any, bias: Any) -> fx.Node:
    """``(x - mean) * invstd * weight + bias`` per channel (dim 1), in float32, cast to x's dtype."""
    shape = [1, int(xv.shape[1])] + [1] * (xv.dim() - 2)

    def per_channel(v: fx.Node) -> fx.Node:
        return _call(gm, aten.view.default, (v, shape))
    y = _call(gm, aten.sub.Tensor, (x, per_channel(mean)))
    y = _call(gm, aten.mul.Tensor, (y, per_channel(invstd)))
    if isinstance(weight, fx.Node):
        y = _call(gm, aten.mul.Tensor, (y, per_channel(weight)))
    if isinstance(bias, fx.Node):
        y = _call(gm, aten.add.Tensor, (y, per_channel(bias)))
    if y.meta["val"].dtype != xv.dtype:
        y = _call(gm, aten._to_copy.default, (y,), {"dtype": xv.dtype})
    return y


# backward ops that read one tensor argument only for its sizes and memory format (ATen's CPU and CUDA
# kernels size and lay out the gradient from it, and read the indices and the incoming gradient), at
# that argument's position
_SHAPE_ONLY: dict[Any, int] = {
    aten.max_pool2d_with_indices_backward.default: 1,
    aten.max_pool3d_with_indices_backward.default: 1,
}


def _same_layout(a: FakeTensor, b: FakeTensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            and a.stride() == b.stride())


_SAME_VALUES = (aten.detach.default, aten.alias.default, aten.clone.default)


def shape_donor(n: fx.Node) -> fx.Node:
    """The farthest ancestor of ``n`` through pointwise ops (and detach/alias/clone) that has ``n``'s
    sizes, dtype and strides (``n`` itself when none has)."""
    val = n.meta.get("val")
    if not isinstance(val, FakeTensor):
        return n
    cur = n
    while (cur.op == "call_function" and isinstance(cur.target, torch._ops.OpOverload)
           and (torch.Tag.pointwise in cur.target.tags or cur.target in _SAME_VALUES)):
        same = [a for a in cur.all_input_nodes
                if isinstance(a.meta.get("val"), FakeTensor) and _same_layout(a.meta["val"], val)]
        if not same:
            break
        cur = same[0]
    return cur


def shape_only_arguments(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` in place: a max-pool backward's input argument (read for its sizes and layout
    only) taken from the farthest pointwise ancestor with the same layout. The pooled tensor of a CNN's
    stem is ``relu(batch_norm(conv))``; passing it made the backward recompute it (a full pass over the
    largest activation, recompute.py's normalisation) or the forward save it, only to be sized. The
    convolution's output, which BatchNorm's backward reads anyway, serves as well. Returns how many
    arguments were replaced."""
    replaced = 0
    for n in gm.graph.nodes:
        pos = _SHAPE_ONLY.get(n.target) if n.op == "call_function" else None
        if pos is None or len(n.args) <= pos or not isinstance(n.args[pos], fx.Node):
            continue
        arg = n.args[pos]
        donor = shape_donor(arg)
        if donor is not arg:
            n.update_arg(pos, donor)
            replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced
