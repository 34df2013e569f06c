"""Helpers to build scheduled kernels by hand and run them through the Triton backend (tests, debugging).

Buffers are named tensors; ``load``/``store`` index them with their own strides over kernel vars.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy
import torch

from ...ir import Expr, IndexExpr, Kernel, KernelNode, Load, index_vars, reads, walk
from ...ir.index import as_index, contiguous_strides, strided_index
from ...knobs import triton_interpret
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .wrapper import TritonKernels


def xs(n: int) -> tuple[sympy.Symbol, ...]:
    return index_vars("x", n)


def rs(n: int) -> tuple[sympy.Symbol, ...]:
    return index_vars("r", n)


def strided(vars_: Sequence[IndexExpr], t: torch.Tensor | Sequence[int], offset: int | torch.SymInt = 0) -> IndexExpr:
    """The flat offset of ``vars_`` in ``t`` (a tensor's strides, or a contiguous shape)."""
    stride = t.stride() if isinstance(t, torch.Tensor) else contiguous_strides([as_index(s) for s in t])
    return strided_index(list(vars_), [as_index(s) for s in stride], as_index(offset))


def load(buf: str, vars_: Sequence[IndexExpr], t: torch.Tensor, dtype: torch.dtype | None = None) -> Load:
    return Load(buf, strided(vars_, t, t.storage_offset()), dtype or t.dtype)


def node(buf: str, body: Expr, index: IndexExpr, *, role: str = "full", kind: str = "pointwise",
         stage: int = 0, store: bool = True, reduction_type: str = "", dtype: torch.dtype | None = None
         ) -> KernelNode:
    return KernelNode(buf, role, kind, body, sympy.sympify(index), dtype or body.dtype, stage, store, reduction_type)


def kernel(name: str, outer: Sequence[object], inner: Sequence[object], nodes: Sequence[KernelNode]) -> Kernel:
    produced = {n.buffer for n in nodes}
    inputs = list(dict.fromkeys(ld.buffer for n in nodes for ld in reads(n.body) if ld.buffer not in produced))
    outputs = [n.buffer for n in nodes if n.store]
    return Kernel(name, tuple(as_index(s) if not isinstance(s, sympy.Expr) else s for s in outer),
                  tuple(as_index(s) if not isinstance(s, sympy.Expr) else s for s in inner), tuple(nodes),
                  tuple(inputs), tuple(outputs))


def run(kernels: Sequence[Kernel], buffers: Mapping[str, torch.Tensor], sizes: Mapping[str, int] | None = None,
        cfg: TritonConfig = DEFAULT_CONFIG) -> TritonKernels:
    """Generate, load and launch ``kernels`` in order over ``buffers``; returns the generated kernels."""
    tk = TritonKernels(kernels, cfg)
    tk.run(buffers, sizes)
    return tk


def uses_random(k: Kernel) -> bool:
    return any(getattr(e, "name", "") in ("rand", "randn") for n in k.nodes for e in walk(n.body))


def device() -> str:
    """Where tests put tensors: the GPU when one is present and the interpreter is off, else CPU."""
    return "cuda" if torch.cuda.is_available() and not triton_interpret() else "cpu"
