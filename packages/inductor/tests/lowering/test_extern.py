"""Extern calls get their tensor arguments in the layout the trace (eager) gave them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import check


def _g(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_conv_input_is_stored_in_the_traced_channels_last_layout():
    # NHWC math permuted to NCHW (ConvNeXt's LayerNorm2d before a downsample conv): eager's conv sees
    # a channels-last input and returns channels-last; kiln's must see the same, or the conv returns
    # NCHW and its output needs a copy into the planned (traced) layout
    def fn(x, w):
        return (F.conv2d((x * 2 + 1).permute(0, 3, 1, 2), w, stride=2).permute(0, 2, 3, 1) + 1).reshape(-1, 8)

    cg = check(fn, _g(2, 8, 8, 4), _g(8, 4, 2, 2))
    code = cg.texts["output_code"]
    assert "torch.empty_strided((2, 4, 8, 8), (256, 1, 32, 4)" in code, code


def test_mm_of_a_lazy_transposed_value_still_matches():
    check(lambda a, b: (a * 2).t() @ b, _g(6, 5), _g(6, 3))
