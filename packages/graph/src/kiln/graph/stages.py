"""Stage objects handed across boundaries; each prints itself with ``as_text()``.

Only the objects more than one stage reads live here (CapturedGraph, CompiledGraph, PortableProgram).
Stage-private objects — autograd's JointGraph/Partitioned, inductor's LoopProgram, runtime's
Artifact — live in their packages and satisfy the same ``StageObject`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import fx

from .dialects import Dialect
from .guards import GuardSet
from .printer import print_graph
from .spec import TensorSpec

# What a backend is handed beside the graph, one per placeholder: a tensor (fake or real), a size
# (an int, or a SymInt when it varies) or another Python scalar
ExampleInput = torch.Tensor | torch.SymInt | torch.SymFloat | torch.SymBool | int | float | bool
# What a backend returns: called with one value per placeholder, it returns the graph's outputs
CompiledFn = Callable[..., Any]
# torch.compile's backend contract: backend(gm, example_inputs) -> callable
Backend = Callable[[fx.GraphModule, Sequence[ExampleInput]], CompiledFn]


@runtime_checkable
class StageObject(Protocol):
    def as_text(self) -> str: ...


@dataclass(frozen=True)
class CapturedGraph:
    """Capture's output: a torch-dialect graph, the sources of its inputs, and the guards it assumed."""

    gm: fx.GraphModule
    input_sources: tuple[str, ...]  # e.g. "L['x']", "L['self'].fc.weight"
    input_specs: tuple[TensorSpec | int | None, ...]
    guards: GuardSet
    dialect: Dialect = Dialect.TORCH

    def as_text(self) -> str:
        inputs = "\n".join(f"  {src}: {spec.as_text() if isinstance(spec, TensorSpec) else spec}"
                           for src, spec in zip(self.input_sources, self.input_specs))
        return (f"# captured graph ({self.dialect})\n# inputs:\n{inputs}\n"
                f"{print_graph(self.gm)}\n# guards:\n{self.guards.as_text()}")


@dataclass(frozen=True)
class PortableProgram:
    """A compiled graph as a Python module source plus named binary files, savable without pickle.

    The source defines ``def call(args: list) -> tuple`` and may read ``FILES[name]`` (bytes) and
    ``FILES_DIR`` (a directory holding the files) that the loader injects into its globals.
    """

    source: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    requires: tuple[str, ...] = ("torch",)  # distributions the source imports
    # the Triton kernel modules the source imports (kiln.runtime's load_triton_module names them
    # kiln_triton_<hash of their text>): whose compiled kernels a save ships with the program
    triton_modules: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompiledGraph:
    """A backend's result: a callable plus every stage's text form and, if it has one, a portable form.

    Copies that change a field use ``dataclasses.replace``, so every declared field travels.
    """

    fn: Callable[..., Any]
    backend: str
    texts: Mapping[str, str] = field(default_factory=dict)  # stage name -> text, in pipeline order
    portable: PortableProgram | None = None
    # the strides each output really has (None: not a tensor), when the compiler chose some outputs'
    # layout (GraphAnnotations.layout_free_outputs); None: every output has its traced strides
    output_strides: tuple[tuple[int, ...] | None, ...] | None = None
    # blocks until kernels compiling in the background are ready (the first call waits too)
    wait_kernels: Callable[[], object] | None = None
    # stage-private results kept for inspection and tests: inductor's LoopProgram and schedule,
    # autograd's traced and partitioned graphs (kiln.autograd.AotResult)
    loop_program: StageObject | None = None
    scheduled: StageObject | None = None
    aot: object | None = None
    # symbolic graphs: the size relations the compiled code assumed (its wrapper checks them on every
    # call and raises GuardError), and where each size symbol is read from ("L['x'].size()[0]"-style)
    size_guards: tuple[str, ...] = ()
    size_sources: Mapping[str, str] = field(default_factory=dict)
    # a better portable form that becomes ready after the backend returned (kiln.inductor's tiered
    # wrapper: the C++ wrapper built in the background): ``later(callback)`` calls ``callback(program)``
    # once, from whatever thread finished it, if it ever is (the graph cache stores it for later processes)
    later: Callable[[Callable[[PortableProgram], None]], None] | None = None
    # the callable gets faster as it runs (a tiered wrapper moving to its C++ wrapper once the graph is
    # hot): the graph cache hands it, not a reload of its entry, to later hits on its key in this process
    improves: bool = False

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def as_text(self) -> str:
        return "\n\n".join(f"# ---- {name} ----\n{text}" for name, text in self.texts.items())


def example_specs(example_inputs: Sequence[Any]) -> tuple[TensorSpec | int | None, ...]:
    out: list[TensorSpec | int | None] = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            out.append(TensorSpec.from_tensor(x))
        elif isinstance(x, int):
            out.append(x)
        else:
            out.append(None)
    return tuple(out)
