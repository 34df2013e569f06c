"""LoopProgram: a whole graph lowered to loop IR (inputs, nodes in order, outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .expr import reads
from .nodes import (
    ComputedBuffer,
    ConstArg,
    ExternKernel,
    InputBuffer,
    Layout,
    Node,
    TensorRef,
    args_buffers,
    loop_bodies,
)
from .sizes import SizeGuard, SizeSource

Output = TensorRef | ConstArg


@dataclass(frozen=True, slots=True)
class LoopProgram:
    name: str
    inputs: tuple[InputBuffer, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Output, ...]
    seed_buffer: str | None = None  # int64[1] buffer the wrapper fills per call when bodies draw random numbers
    # symbolic sizes (ir/sizes.py): where the wrapper reads each size symbol, the relations choices
    # assumed (checked per call), and the placeholders that are symbolic ints (unpacked by the wrapper)
    sizes: tuple[SizeSource, ...] = ()
    size_guards: tuple[SizeGuard, ...] = ()
    scalar_inputs: tuple[int, ...] = ()
    # 32: a guard keeps every tensor's extent within 32-bit indexing (index_width.py)
    index_bits: int = 64

    @property
    def hints(self) -> dict[str, int]:
        return {s.symbol: s.hint for s in self.sizes}

    def layouts(self) -> dict[str, Layout]:
        out: dict[str, Layout] = {b.name: b.layout for b in self.inputs}
        for n in self.nodes:
            if isinstance(n, ComputedBuffer):
                out[n.name] = n.layout
            else:
                for o in n.outputs:
                    out[o.buffer] = o.layout
        if self.seed_buffer:
            import torch
            out[self.seed_buffer] = Layout.contiguous((sympy.Integer(1),), torch.int64)
        return out

    def as_text(self) -> str:
        lines = [f"# loop program {self.name}"]
        for b in self.inputs:
            lines.append(f"{b.name}: {b.layout.as_text()} = input {b.position}")
        if self.seed_buffer:
            lines.append(f"{self.seed_buffer}: int64[1] = random seed")
        lines += [f"{z.symbol} = {z.source}  # size (example: {z.hint})" for z in self.sizes]
        lines += [f"guard {g.expr}  # {g.reason}" for g in self.size_guards]
        lines += [n.as_text() for n in self.nodes]
        lines.append("return (" + ", ".join(o.as_text() for o in self.outputs) + ")")
        return "\n".join(lines)


def node_reads(n: Node) -> list[str]:
    """Buffers a node reads, in first-read order."""
    if isinstance(n, ComputedBuffer):
        return list(dict.fromkeys(ld.buffer for body in loop_bodies(n.data) for ld in reads(body)))
    assert isinstance(n, ExternKernel)
    return list(dict.fromkeys(args_buffers(n.args) + args_buffers(tuple(v for _, v in n.kwargs)) + list(n.holds)))
