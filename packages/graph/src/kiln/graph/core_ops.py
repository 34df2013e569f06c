"""The core ATen operator set: what the ``core_aten`` dialect may contain and code generators lower.

kiln.decomp owns the decompositions into this set and may grow it; the verifier reads it from here so
that every stage agrees on one list. Names are ``aten.<op>.<overload>``. Everything else that models
produce in forward and backward (activations, norms, losses, dropout, embedding, upsampling, views
like ``t``/``transpose``/``reshape``, ``split``/``unbind``, ``masked_fill``...) decomposes into it:
``kiln-decomp list --table core_aten`` shows the rules.
"""

from __future__ import annotations

_GROUPS: dict[str, str] = {
    "elementwise unary": """
        abs.default acos.default acosh.default asin.default asinh.default atan.default atanh.default
        ceil.default cos.default cosh.default erf.default exp.default expm1.default floor.default
        log.default log10.default log1p.default log2.default neg.default reciprocal.default
        round.default rsqrt.default sigmoid.default sign.default sin.default sinh.default
        sqrt.default tan.default tanh.default trunc.default bitwise_not.default logical_not.default
        isinf.default isnan.default
    """,
    "elementwise binary and ternary": """
        add.Tensor add.Scalar sub.Tensor sub.Scalar mul.Tensor mul.Scalar div.Tensor div.Scalar
        div.Tensor_mode pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar maximum.default
        minimum.default atan2.default fmod.Tensor fmod.Scalar remainder.Tensor remainder.Scalar
        eq.Scalar eq.Tensor ne.Scalar ne.Tensor lt.Scalar lt.Tensor le.Scalar le.Tensor gt.Scalar
        gt.Tensor ge.Scalar ge.Tensor bitwise_and.Tensor bitwise_or.Tensor bitwise_xor.Tensor
        logical_and.default logical_or.default logical_xor.default where.self clamp.default
        clamp.Tensor
    """,
    "reductions and scans": """
        sum.dim_IntList sum.default amax.default amin.default prod.default prod.dim_int any.default
        any.dim argmax.default argmin.default max.dim min.dim mean.dim var.correction cumsum.default
        sort.default topk.default
    """,
    "matmul, convolution, attention (extern kernels)": """
        mm.default bmm.default addmm.default convolution.default convolution_backward.default
        _scaled_dot_product_flash_attention.default
        _scaled_dot_product_flash_attention_backward.default
        _scaled_dot_product_efficient_attention.default
        _scaled_dot_product_efficient_attention_backward.default
        _scaled_dot_product_flash_attention_for_cpu.default
        _scaled_dot_product_flash_attention_for_cpu_backward.default
        _scaled_dot_product_cudnn_attention.default
        _scaled_dot_product_cudnn_attention_backward.default
    """,
    "views and layout": """
        view.default permute.default expand.default squeeze.dims unsqueeze.default slice.Tensor
        select.int as_strided.default alias.default clone.default _to_copy.default copy.default
        cat.default constant_pad_nd.default flip.default
    """,
    "indexing": """
        gather.default scatter.src scatter.value scatter_add.default scatter_reduce.two
        index.Tensor index_put.default index_select.default slice_scatter.default
        select_scatter.default
    """,
    "creation and random": """
        full.default full_like.default empty.memory_format empty_strided.default
        scalar_tensor.default arange.start_step fill.Scalar rand.default randn.default
        randint.low bernoulli.p
    """,
    "pooling": """
        avg_pool2d.default avg_pool2d_backward.default max_pool2d_with_indices.default
        max_pool2d_with_indices_backward.default
    """,
    "symbolic sizes and scalars": """
        sym_size.int sym_stride.int sym_numel.default sym_storage_offset.default
        _local_scalar_dense.default
    """,
}

CORE_ATEN_GROUPS: dict[str, frozenset[str]] = {
    group: frozenset(f"aten.{name}" for name in names.split()) for group, names in _GROUPS.items()
}
CORE_ATEN_OPS: frozenset[str] = frozenset().union(*CORE_ATEN_GROUPS.values())
