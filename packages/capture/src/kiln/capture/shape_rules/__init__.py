"""Shape rules: the fake result of common torch calls computed from their inputs' metadata, without
running the call on fake tensors (which capture does for every recorded call only to learn its
result's shape, strides and dtype). Each rule returns ``None`` for anything it is not sure of, and the
call then takes the ordinary path; tests check every rule against that path.

    functions   torch functions (F.linear, F.layer_norm, F.batch_norm, addmm, F.embedding, conv2d,
                torch.arange) and the memo of repeated calls' results
    views       Tensor.view / reshape / transpose / permute / unsqueeze / expand and basic indexing
    pointwise   activations and arithmetic on contiguous floating tensors
"""
