"""The four graph dialects that cross stage boundaries (DESIGN.md, "The typed graph interface")."""

from __future__ import annotations

import enum


class Dialect(enum.Enum):
    """Which operator vocabulary a GraphModule speaks."""

    TORCH = "torch"  # capture's output: torch.* functions, operator.*, tensor methods
    ATEN = "aten"  # autograd's output: functional torch.ops.aten.* overloads
    CORE_ATEN = "core_aten"  # decomp's output: the small set code generators lower
    PRIMS = "prims"  # kiln_prims.*: explicit broadcast and dtype conversion

    def __str__(self) -> str:
        return self.value
