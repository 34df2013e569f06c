"""Kernels generated once per form within a compile.

A transformer's layers schedule the same kernels over other buffers. Generating each one (simplifying
its indices, choosing its blocks, writing its source) took 0.9 s of the 6.5 s Llama-350M's inference
graph spent in Python compiling for CUDA (194 kernels over 24 layers, cross-compiled on a 2-core host).
Here a kernel is generated once per *form*: its buffers renamed by first appearance and its name
replaced by placeholders. A later kernel of the same form takes that result with its own names put back.
``share_identical_kernels`` (dedup.py) still decides afterwards which launches share one Triton function.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from ...ir import Expr, Kernel, Load, map_expr
from .kernel import TritonKernel

_BUFFER = "kilnMemoB"
_NAME = "kilnMemoK"
_TOKEN = re.compile(_BUFFER + r"(\d+)")

Generate = Callable[[Kernel], list[TritonKernel]]


class KernelMemo:
    """One compile's generated kernels by form (one generator: the same blocks options and sizes)."""

    def __init__(self) -> None:
        self.forms: dict[Kernel, list[TritonKernel]] = {}
        self.hits = 0

    def generate(self, k: Kernel, generate: Generate) -> list[TritonKernel]:
        """``generate(k)``, or the kernels of an earlier kernel of ``k``'s form with ``k``'s names."""
        form = _form(k)
        if form is None:
            return generate(k)
        canonical, names = form
        done = self.forms.get(canonical)
        if done is None:
            done = self.forms[canonical] = generate(canonical)
        else:
            self.hits += 1
        return [_named(g, k.name, names) for g in done]


def _form(k: Kernel) -> tuple[Kernel, list[str]] | None:
    """``k`` with placeholder names, and its buffers in placeholder order; None when a buffer's name
    is not an identifier (its pointer parameter's name is then not the buffer's name: generate it)."""
    order: dict[str, str] = {}

    def rename(b: str) -> str:
        return order.setdefault(b, f"{_BUFFER}{len(order)}")

    def load(e: Expr) -> Expr | None:
        return Load(rename(e.buffer), e.index, e.dtype, e.indirect) if isinstance(e, Load) else None

    for b in (*k.inputs, *k.outputs):
        rename(b)
    nodes = tuple(dataclasses.replace(n, buffer=rename(n.buffer), body=map_expr(n.body, load),
                                      store_indirect=tuple(map_expr(e, load) for e in n.store_indirect))
                  for n in k.nodes)
    if not k.name.isidentifier() or not all(b.isidentifier() and _BUFFER not in b for b in order):
        return None
    canonical = dataclasses.replace(k, name=_NAME, nodes=nodes, inputs=tuple(rename(b) for b in k.inputs),
                                    outputs=tuple(rename(b) for b in k.outputs),
                                    inplace=tuple((rename(o), rename(i)) for o, i in k.inplace))
    return canonical, list(order)


def _named(g: TritonKernel, name: str, buffers: list[str]) -> TritonKernel:
    def text(s: str) -> str:
        return _TOKEN.sub(lambda m: buffers[int(m.group(1))], s.replace(_NAME, name))

    return dataclasses.replace(g, name=text(g.name), source=text(g.source),
                               pointer_args=tuple(text(b) for b in g.pointer_args),
                               helpers=tuple(text(h) for h in g.helpers),
                               streams=tuple(dataclasses.replace(s, buffer=text(s.buffer)) for s in g.streams))
