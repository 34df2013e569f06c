"""The C++ wrapper: an inference graph as C++ source over libtorch (no Python), for kiln.package.

``cpp_program(gm, example_inputs, slots)`` runs the inductor pipeline up to the final schedule (the
same passes as ``compile_graph``), then emits the kernels' translation unit (the C++ backend's own
source) and the wrapper's (writer.py). Building them into one ``model.so`` is kiln.runtime.cxx's job.
CPU only for now: CUDA graphs would need Triton cubins launched through the driver API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from kiln.graph import KNOBS as GRAPH_KNOBS
from kiln.graph import VerifyAfterPass, run_pipeline

from ...options import DEFAULT_OPTIONS, InductorOptions
from ...pipeline import PASSES, CompileState, verify_state
from ..cpp import library_source
from .aten_calls import CppWrapperUnsupported
from .prelude import ABI_VERSION
from .writer import Slot, cpp_wrapper_source, output_specs

# the passes up to the final schedule: kernels and the Python wrapper are not generated
_UNTIL = "generate_kernels"


@dataclass(frozen=True)
class CppProgram:
    """The sources of a model library and what its caller must know to call it."""

    name: str
    wrapper_source: str  # the C++ wrapper (includes ATen headers)
    kernel_source: str  # kiln's kernels ("" when the graph has none); built with ``kernel_flags``
    kernel_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    outputs: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]  # (shape, stride, dtype)
    n_kernels: int
    n_externs: int
    texts: Mapping[str, str] = field(default_factory=dict)
    abi_version: int = ABI_VERSION

    @property
    def source_hash(self) -> str:
        h = hashlib.sha256(self.wrapper_source.encode())
        h.update(b"\0" + self.kernel_source.encode() + b"\0" + " ".join(self.kernel_flags).encode())
        return h.hexdigest()


def cpp_program(gm: fx.GraphModule, example_inputs: Sequence[Any], slots: Mapping[int, Slot], *,
                options: InductorOptions = DEFAULT_OPTIONS, name: str = "model") -> CppProgram:
    """Schedule a functional ATen inference graph (CPU tensors) and emit its C++ sources.

    ``slots``: for each graph input position, whether the caller passes it as an input or a constant
    (and which). Raises ``CppWrapperUnsupported`` for what cannot run without Python."""
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        raise CppWrapperUnsupported("the C++ wrapper is CPU only for now (CUDA tensors among the inputs)")
    if options.cpu_backend != "cpp":
        raise CppWrapperUnsupported("the C++ wrapper needs cpu_backend='cpp'")
    options = options.replace(memory_arena=False)
    state = CompileState(gm, list(example_inputs), options, name)
    verify = options.verify if options.verify is not None else GRAPH_KNOBS.verify
    passes = PASSES[:[p.name for p in PASSES].index(_UNTIL)]
    s = run_pipeline(passes, state, None, [VerifyAfterPass(verify_state)] if verify else []).value
    assert s.scheduled is not None and s.program is not None
    kernels = s.scheduled.launched()
    layouts = s.program.layouts()
    source, symbols = library_source(kernels, layouts, options) if kernels else ("", {})
    wrapper = cpp_wrapper_source(s.scheduled, symbols, dict(slots))
    n_ext = sum(1 for st in s.scheduled.steps if not hasattr(st.work, "nodes"))
    flags = tuple(f for f in options.cpp_flags if f != "-shared")
    texts = {**s.texts, "cpp_wrapper": wrapper}
    if s.fallbacks:
        texts["fallbacks"] = "\n".join(s.fallbacks)
    return CppProgram(name, wrapper, source, flags, tuple(options.link_flags),
                      tuple(output_specs(s.program)), len(kernels), n_ext, texts)


__all__ = ["CppProgram", "CppWrapperUnsupported", "Slot", "cpp_program"]
