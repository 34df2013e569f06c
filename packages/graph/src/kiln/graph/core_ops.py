"""The core ATen operator set: what the ``core_aten`` dialect may contain and code generators lower.

kiln.decomp owns the decompositions into this set and may grow it; the verifier reads it from here so
that every stage agrees on one list. Names are ``aten.<op>.<overload>``.
"""

from __future__ import annotations

CORE_ATEN_OPS: frozenset[str] = frozenset(
    """
    aten.abs.default aten.acos.default aten.acosh.default aten.add.Tensor aten.add.Scalar
    aten.addmm.default aten.alias.default aten.amax.default aten.amin.default aten.any.default
    aten.any.dim aten.argmax.default aten.argmin.default aten.as_strided.default aten.asin.default
    aten.asinh.default aten.atan.default aten.atan2.default aten.atanh.default aten.avg_pool2d.default
    aten.avg_pool2d_backward.default aten.bitwise_and.Tensor aten.bitwise_not.default
    aten.bitwise_or.Tensor aten.bitwise_xor.Tensor aten.bmm.default aten.cat.default aten.ceil.default
    aten.clamp.default aten.clamp.Tensor aten.clone.default aten.constant_pad_nd.default
    aten.convolution.default aten.convolution_backward.default aten.copy.default aten.cos.default
    aten.cosh.default aten.cumsum.default aten.div.Tensor aten.div.Tensor_mode aten.div.Scalar
    aten.embedding.default aten.embedding_dense_backward.default aten.empty.memory_format
    aten.empty_strided.default aten.eq.Scalar aten.eq.Tensor aten.erf.default aten.exp.default
    aten.expand.default aten.expm1.default aten.fill.Scalar aten.flip.default aten.floor.default
    aten.fmod.Tensor aten.fmod.Scalar aten.full.default aten.full_like.default aten.gather.default
    aten.ge.Scalar aten.ge.Tensor aten.gt.Scalar aten.gt.Tensor aten.index.Tensor
    aten.index_put.default aten.index_select.default aten.isinf.default aten.isnan.default
    aten.le.Scalar aten.le.Tensor aten.log.default aten.log10.default aten.log1p.default
    aten.log2.default aten.logical_and.default aten.logical_not.default aten.logical_or.default
    aten.logical_xor.default aten.lt.Scalar aten.lt.Tensor aten.max.dim aten.max_pool2d_with_indices.default
    aten.max_pool2d_with_indices_backward.default aten.maximum.default aten.mean.dim aten.min.dim
    aten.minimum.default aten.mm.default aten.mul.Tensor aten.mul.Scalar aten.native_dropout.default
    aten.ne.Scalar aten.ne.Tensor aten.neg.default aten.permute.default aten.pow.Tensor_Scalar
    aten.pow.Tensor_Tensor aten.pow.Scalar aten.prod.default aten.prod.dim_int aten.rand.default
    aten.randn.default aten.reciprocal.default aten.remainder.Scalar aten.remainder.Tensor
    aten.round.default aten.rsqrt.default aten.scalar_tensor.default aten.scatter.src
    aten.scatter.value aten.scatter_add.default aten.scatter_reduce.two aten.select.int
    aten.sigmoid.default aten.sign.default aten.sin.default aten.sinh.default aten.slice.Tensor
    aten.slice_scatter.default aten.select_scatter.default aten.sort.default aten.sqrt.default
    aten.squeeze.dims aten.sub.Tensor aten.sub.Scalar aten.sum.dim_IntList aten.sum.default
    aten.tan.default aten.tanh.default aten.topk.default aten.trunc.default aten.unsqueeze.default
    aten.var.correction aten.view.default aten.where.self aten.iota.default
    aten._scaled_dot_product_flash_attention.default aten._scaled_dot_product_efficient_attention.default
    aten._scaled_dot_product_flash_attention_for_cpu.default
    aten._scaled_dot_product_cudnn_attention.default
    aten._to_copy.default aten.bernoulli.p aten.native_batch_norm.default
    aten.randint.low aten.max_pool2d_with_indices.default aten.split_with_sizes.default
    aten.unbind.int aten.sym_size.int aten.sym_stride.int aten.sym_numel.default
    aten.sym_storage_offset.default aten.masked_fill.Scalar aten.masked_fill.Tensor
    """.split()
)
