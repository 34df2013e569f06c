"""Hand-written samples for rules no OpInfo reaches: ``op name -> [(op, args, kwargs), ...]``.

Composite ops (``linear``, ``reshape``, ``norm``...) never reach a dispatch mode, so their rules only
apply when a graph names them; these samples call the rules directly against eager.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _bn_args():
    return [r(4, 3, 5, 5), r(3), r(3), r(3), torch.rand(3) + 0.5]


_SAMPLES = [
    (aten._batch_norm_no_update.default, [r(4, 3, 5), r(3), r(3), r(3), torch.rand(3) + 0.5, 0.1, 1e-5], {}),
    (aten._batch_norm_with_update.default, [*_bn_args(), 0.1, 1e-5], {}),
    (aten._batch_norm_with_update_functional.default, [*_bn_args(), 0.1, 1e-5], {}),
    (aten._native_batch_norm_legit_functional.default, [*_bn_args(), True, 0.1, 1e-5], {}),
    (aten._native_batch_norm_legit_no_training.default, [*_bn_args(), 0.1, 1e-5], {}),
    (aten._native_batch_norm_legit.no_stats, [r(4, 3, 5, 5), r(3), r(3), True, 0.1, 1e-5], {}),
    (aten._fused_rms_norm.default, [r(2, 3, 8), [8], r(8), 1e-6], {}),
    (aten._fused_rms_norm.default, [r(2, 3, 8), [3, 8], None, None], {}),
    (aten._reshape_alias.default, [r(2, 6), [3, 4], [4, 1]], {}),
    (aten._safe_softmax.default, [torch.tensor([[1.0, 2.0, float("-inf")], [float("-inf")] * 3]), -1], {}),
    (aten._unsafe_index.Tensor, [r(5, 4), [torch.tensor([0, 3, 3])]], {}),
    (aten._unsafe_index_put.default, [r(5, 4), [torch.tensor([0, 3, 1])], r(3, 4), True], {}),
    (aten.adaptive_max_pool2d.default, [r(2, 3, 8, 8), [4, 2]], {}),
    (aten.any.dims, [r(3, 4, 5) > 1, [0, 2], True], {}),
    (aten.arange.default, [7], {"dtype": torch.float32}),
    (aten.arange.start, [2, 9], {}),
    (aten.bitwise_and.Scalar, [torch.arange(10), 6], {}),
    (aten.bitwise_or.Scalar, [torch.arange(10), 6], {}),
    (aten.bitwise_xor.Scalar, [torch.arange(10), 6], {}),
    (aten.clamp_max.default, [r(10), 0.3], {}),
    (aten.clamp_min.default, [r(10), -0.3], {}),
    (aten.count_nonzero.dim_IntList, [torch.tensor([[0.0, 1.0], [2.0, 0.0]]), [1]], {}),
    (aten.div.Scalar_mode, [r(10), 0.7], {"rounding_mode": "floor"}),
    (aten.fill.Tensor, [r(3, 4), torch.tensor(2.5)], {}),
    (aten.floor_divide.Scalar, [r(10) * 5, 2], {}),
    (aten.l1_loss.default, [r(4, 5), r(4, 5), 1], {}),
    (aten.lerp.Tensor, [r(6), r(6), torch.rand(6)], {}),
    (aten.lift_fresh_copy.default, [r(3)], {}),
    (aten.linear.default, [r(4, 5), r(3, 5), r(3)], {}),
    (aten.linear.default, [r(2, 4, 5), r(3, 5)], {}),
    (aten.max_pool2d.default, [r(2, 3, 8, 8), [3, 3], [2, 2], [1, 1]], {}),
    (aten.narrow.default, [r(6, 4), 0, -4, 3], {}),
    (aten.native_dropout.default, [r(100), 0.0, True], {}),
    (aten.native_dropout.default, [r(100), 0.5, False], {}),
    (aten.native_dropout_backward.default, [r(100), torch.rand(100) > 0.5, 2.0], {}),
    (aten.new_empty_strided.default, [r(2), [3, 4], [4, 1]], {}),
    (aten.norm.Scalar, [r(3, 4), 3], {}),
    (aten.norm.ScalarOpt_dim, [r(3, 4), 2, [1], True], {}),
    (aten.numpy_T.default, [r(2, 3, 4)], {}),
    (aten.outer.default, [r(3), r(4)], {}),
    (aten.rand_like.default, [r(3, 4)], {}),
    (aten.randn_like.default, [r(3, 4)], {}),
    (aten.reshape.default, [r(3, 4).t(), [-1]], {}),
    (aten.rsub.Scalar, [r(5), 2.0], {}),
    (aten.scatter.value_reduce, [r(3, 5), 1, torch.tensor([[0, 1], [2, 2], [4, 0]]), 2.0], {"reduce": "multiply"}),
    (aten.select_backward.default, [r(3, 5), [3, 4, 5], 1, 2], {}),
    (aten.square.default, [r(5)], {}),
    (aten.std.default, [r(5, 4)], {}),
    (aten.std.dim, [r(5, 4), [0], False, True], {}),
    (aten.take_along_dim.default, [r(3, 4), torch.tensor([[0], [3], [1]]), 1], {}),
    (aten.upsample_bilinear2d.vec, [r(1, 2, 4, 5), None, False, [2.0, 1.5]], {}),
    (aten.upsample_nearest2d.default, [r(1, 2, 4, 5), [8, 7]], {}),
    (aten.upsample_nearest2d.vec, [r(1, 2, 4, 5), [7, 10], None], {}),
    (aten.upsample_nearest2d_backward.default, [r(1, 2, 8, 7), [8, 7], [1, 2, 4, 5]], {}),
    (aten.var.default, [r(5, 4), False], {}),
    (aten.var.dim, [r(5, 4), [1], True, True], {}),
    (aten.where.ScalarOther, [r(5) > 0, r(5), 3.0], {}),
    (aten.where.ScalarSelf, [r(5) > 0, 3.0, r(5)], {}),
    (aten.zero.default, [r(5)], {}),
    (aten.bernoulli.default, [torch.rand(50)], {}),
    (aten.lift_fresh.default, [r(3)], {}),
    (aten.alias_copy.default, [r(3)], {}),
    (aten.detach_copy.default, [r(3)], {}),
    (aten.diagonal_copy.default, [r(3, 4), 1], {}),
    (aten.select_copy.int, [r(3, 4), 1, -1], {}),
    (aten.slice_copy.Tensor, [r(5, 4), 0, 1, 4, 2], {}),
    (aten.split_with_sizes_copy.default, [r(5, 4), [2, 3]], {}),
    (aten.squeeze_copy.dims, [r(1, 4, 1), [0, 2]], {}),
    (aten.t_copy.default, [r(3, 4)], {}),
    (aten.transpose_copy.int, [r(2, 3, 4), 0, 2], {}),
    (aten.unbind_copy.int, [r(3, 4), 1], {}),
    (aten.unfold_copy.default, [r(3, 8), 1, 3, 2], {}),
    (aten.unsqueeze_copy.default, [r(3, 4), -1], {}),
    (aten.reflection_pad2d.default, [r(1, 2, 4, 5), [1, 2, 3, 0]], {}),
    (aten.reflection_pad2d_backward.default, [r(1, 2, 7, 8), r(1, 2, 4, 5), [1, 2, 3, 0]], {}),
    (aten.reflection_pad3d.default, [r(1, 2, 3, 4, 5), [1, 1, 2, 0, 1, 2]], {}),
    (aten.reflection_pad3d_backward.default, [r(1, 2, 6, 6, 7), r(1, 2, 3, 4, 5), [1, 1, 2, 0, 1, 2]], {}),
    (aten.replication_pad3d.default, [r(1, 2, 3, 4, 5), [1, 1, 2, 0, 1, 2]], {}),
    (aten.replication_pad3d_backward.default, [r(1, 2, 6, 6, 7), r(1, 2, 3, 4, 5), [1, 1, 2, 0, 1, 2]], {}),
    (aten.as_strided_scatter.default, [r(4, 3), r(3, 2), [3, 2], [1, 3], 1], {}),
]


def _mp_backward():
    x = r(2, 3, 8, 8)
    out, idx = aten.adaptive_max_pool2d.default(x, [4, 4])
    return (aten.adaptive_max_pool2d_backward.default, [r(2, 3, 4, 4), x, idx], {})


def _bn_backward():
    x, w = r(4, 3, 5), r(3)
    _, mean, invstd = aten.native_batch_norm.default(x, w, r(3), None, None, True, 0.1, 1e-5)
    return (aten.batch_norm_backward.default,
            [r(4, 3, 5), x, w, r(3), torch.rand(3) + 0.5, mean, invstd, True, 1e-5, [True, True, True],
             torch.empty(0, dtype=torch.uint8)], {})


def all_samples():
    """op name -> list of (op, args, kwargs)."""
    out: dict[str, list] = {}
    for op, args, kwargs in [*_SAMPLES, _mp_backward(), _bn_backward()]:
        name = f"aten.{op._schema.name.split('::')[-1]}.{op._overloadname}"
        out.setdefault(name, []).append((op, args, kwargs))
    return out


HAND_SAMPLES = all_samples()
