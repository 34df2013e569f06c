"""Smoke test of kiln-decomp installed alone (with kiln-graph)."""

import torch

import kiln.decomp as decomp
from kiln.graph import verify

table = decomp.table("core_aten")
assert len(table) > 50, len(table)
gelu = table[torch.ops.aten.gelu.default]
x = torch.randn(16)
torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x))
gm = decomp.trace(lambda a: torch.nn.functional.layer_norm(a, (16,)).sigmoid(), (x.reshape(1, 16),)) \
    if hasattr(decomp, "trace") else None
if gm is not None:
    verify(decomp.decompose(gm, table), "core_aten")
print("kiln-decomp alone: ok")
