"""An extern's argument that is an expanded lazy value is stored once and passed as a stride-0 view
(lowering/extern.py ``_realize_broadcast``), as eager passes it."""

from __future__ import annotations

import torch
from helpers import check

from kiln.inductor import InductorOptions

OPTS = InductorOptions(strict_lowering=True)


def test_expanded_lazy_operand_is_stored_once_and_matches_eager() -> None:
    a, b = torch.randn(6, 5, 7), torch.randn(1, 7, 3)
    cg = check(lambda a, b: (torch.bmm(a, (b * 2 + 1).expand(6, 7, 3)),), a, b, options=OPTS)
    text = cg.texts["ir_pre_fusion"]
    buffers = [ln.split("=")[0] for ln in text.splitlines() if ln.strip().startswith("buf")]
    assert any("float32[1, 7, 3]" in b for b in buffers), text  # stored once ...
    assert not any("float32[6, 7, 3]" in b for b in buffers), text  # ... never six times
    assert "(0, 3, 1)" in text, text  # and passed as a stride-0 view


def test_a_lazy_operand_that_varies_along_every_dim_is_stored_whole() -> None:
    a, b = torch.randn(6, 5, 7), torch.randn(6, 7, 3)
    check(lambda a, b: (torch.bmm(a, b * 2 + 1),), a, b, options=OPTS)
