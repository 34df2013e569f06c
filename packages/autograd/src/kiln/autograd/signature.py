"""What the runtime wrapper needs to know about a traced graph, kept as plain frozen data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from torch.utils._pytree import TreeSpec


class OutputKind(StrEnum):
    GRAPH = "graph"  # computed by the graph
    INPUT = "input"  # the input tensor object itself
    ALIAS_INPUT = "alias_input"  # a view of an input: regenerated at run time with as_strided
    ALIAS_OUTPUT = "alias_output"  # a view of an earlier graph output
    SAME = "same"  # the very same tensor as an earlier output
    CONSTANT = "constant"  # a non-tensor value (int, None, ...)
    # a Python number computed from symbolic inputs (a float argument, a size): ``value`` is its Python
    # expression over GraphSignature.symbols, evaluated on each call's arguments
    SYMBOLIC = "symbolic"


@dataclass(frozen=True, slots=True)
class OutputInfo:
    kind: OutputKind
    index: int = -1  # graph-output index, input index, or earlier user-output index
    # a view's metadata; a str is a symbolic size as a Python expression over GraphSignature.symbols
    size: tuple[int | str, ...] = ()
    stride: tuple[int | str, ...] = ()
    storage_offset: int | str = 0
    requires_grad: bool = False
    value: Any = None  # for CONSTANT; for SYMBOLIC the expression (a str)

    @property
    def symbolic(self) -> bool:
        return any(isinstance(v, str) for v in (*self.size, *self.stride, self.storage_offset))

    def as_text(self) -> str:
        if self.kind is OutputKind.CONSTANT:
            return f"constant {self.value!r}"
        if self.kind is OutputKind.SYMBOLIC:
            return f"symbolic {self.value}"
        view = f" view{list(self.size)} stride{list(self.stride)} +{self.storage_offset}" \
            if self.kind in (OutputKind.ALIAS_INPUT, OutputKind.ALIAS_OUTPUT) else ""
        return f"{self.kind.value}[{self.index}]{view}{' (requires_grad)' if self.requires_grad else ''}"


@dataclass(frozen=True, slots=True)
class GraphSignature:
    """Inputs, outputs, mutations and gradients of a traced graph.

    The forward graph returns ``n_graph_outputs`` user values, then the new values of
    ``mutated_inputs`` (written back with ``copy_`` after the call). A joint graph then returns one
    gradient per ``grad_inputs`` entry and takes one tangent per differentiable graph output.
    """

    n_inputs: int
    input_names: tuple[str, ...]
    input_requires_grad: tuple[bool, ...]
    outputs: tuple[OutputInfo, ...]
    out_spec: TreeSpec
    n_graph_outputs: int
    graph_output_differentiable: tuple[bool, ...]
    mutated_inputs: tuple[int, ...]
    grad_inputs: tuple[int, ...]
    n_lifted: int = 0  # leading inputs that are module parameters/buffers lifted from get_attr
    # where each size symbol is read at run time: (name, input index, dim, or -1 for an int input)
    symbols: tuple[tuple[str, int, int], ...] = ()

    @property
    def n_tangents(self) -> int:
        return sum(self.graph_output_differentiable)

    def as_text(self) -> str:
        lines = [f"# inputs: {self.n_inputs} ({self.n_lifted} lifted module state)"]
        lines += [f"#   {i}: {n}{' (requires_grad)' if rg else ''}{' (mutated)' if i in self.mutated_inputs else ''}"
                  for i, (n, rg) in enumerate(zip(self.input_names, self.input_requires_grad))]
        lines.append("# outputs:")
        lines += [f"#   {i}: {o.as_text()}" for i, o in enumerate(self.outputs)]
        if self.grad_inputs:
            lines.append(f"# gradients for inputs {list(self.grad_inputs)}")
        return "\n".join(lines)
