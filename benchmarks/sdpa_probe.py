"""Which SDPA backend does torch pick for BERT/GPT-2-style attention (bf16, additive float mask of
shape (B, 1, S, S))? Eager and fake-tensor choices, and why the fused kernels are refused (GPU only)."""

import warnings

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel


def inputs(mask_dtype=torch.bfloat16, expand=True):
    x = torch.randn(8, 512, 3, 12, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    m = torch.zeros(8, 1, 512, 512, device="cuda", dtype=mask_dtype)
    if expand:
        m = torch.zeros(8, 1, 1, 512, device="cuda", dtype=mask_dtype).expand(8, 1, 512, 512)
    return q, k, v, m


for expand in (False, True):
    q, k, v, m = inputs(expand=expand)
    print("expand", expand, "eager choice:", SDPBackend(torch._fused_sdp_choice(q, k, v, m, 0.0, False)).name)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv, fm = (mode.from_tensor(t) for t in (q, k, v, m))
        print("  fake choice:", SDPBackend(torch._fused_sdp_choice(fq, fk, fv, fm, 0.0, False)).name)
    for b in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with warnings.catch_warnings(record=True) as w, sdpa_kernel(b):
            warnings.simplefilter("always")
            try:
                F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                print("  ", b.name, "ok")
            except RuntimeError as e:
                print("  ", b.name, "refused:", str(e)[:100], "|", "; ".join(str(x.message)[:160] for x in w))
