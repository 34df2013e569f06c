"""TensorSpec: the typed metadata of a tensor value at a stage boundary."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch

if TYPE_CHECKING:
    import sympy

# Note: sympy is imported only where a size is symbolic. Importing it costs ~0.3 s, which a process
# that only loads and runs saved artifacts (kiln.runtime) never needs for static shapes.
Dim: TypeAlias = "int | sympy.Expr"


def _dim(d: object) -> Dim:
    if type(d) is int:
        return d
    if isinstance(d, torch.SymInt):
        import sympy

        return sympy.sympify(str(d.node.expr)) if hasattr(d, "node") else sympy.Symbol(str(d))
    sympy_module = sys.modules.get("sympy")  # no sympy imported: d cannot be a sympy expression
    if sympy_module is not None and isinstance(d, sympy_module.Expr):
        return d
    return int(d)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape (ints or sympy expressions), dtype, device, stride and requires_grad of a tensor."""

    shape: tuple[Dim, ...]
    dtype: torch.dtype
    device: torch.device
    stride: tuple[Dim, ...]
    requires_grad: bool = False

    @staticmethod
    def from_tensor(t: torch.Tensor) -> TensorSpec:
        """Read the spec of a real, fake or meta tensor (symbolic sizes become sympy expressions)."""
        return TensorSpec(
            shape=tuple(_dim(s) for s in t.shape),
            dtype=t.dtype,
            device=t.device,
            stride=tuple(_dim(s) for s in t.stride()),
            requires_grad=bool(t.requires_grad),
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(s, int) for s in self.shape)

    def numel(self) -> Dim:
        n: Dim = 1
        for s in self.shape:
            n = n * s  # type: ignore[assignment,operator]
        return n

    def as_text(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        shape = ", ".join(str(s) for s in self.shape)
        stride = ", ".join(str(s) for s in self.stride)
        grad = " grad" if self.requires_grad else ""
        return f"{dt}[{shape}] stride=({stride}) {self.device}{grad}"

    __str__ = as_text
