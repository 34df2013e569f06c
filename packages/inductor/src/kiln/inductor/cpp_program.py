"""An inference graph as C++ sources over libtorch (no Python), for kiln.package.

``cpp_program(gm, example_inputs, slots)`` runs the inductor pipeline up to the final schedule (the
same passes as ``compile_graph``), then emits the kernels' translation unit (the C++ backend's own
source) and the C++ wrapper's (codegen/cpp_wrapper/writer.py). Building them into one ``model.so`` is
kiln.runtime.cxx's job.

CUDA (example inputs on a CUDA device, real or fake): the Triton backend generates the kernels, which
are compiled ahead of time into cubins for ``cuda_arch`` (codegen/triton/cubins.py, no GPU needed), and
the wrapper launches them through the CUDA driver API (kiln/model_support_cuda.h). Large misaligned
matmuls are not padded (``pad_matmuls``: kiln's padded matmul is a Python-registered op).
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

from .codegen.cpp import library_source
from .codegen.cpp_wrapper import (
    ABI_VERSION,
    CppWrapperUnsupported,
    CppWrapperWriter,
    CudaKernels,
    Slot,
    cpp_wrapper_source,
    output_specs,
)
from .codegen.triton.backend import TritonBackend
from .codegen.triton.cubins import Cubin, CubinUnsupported, compile_cubins
from .codegen.triton.wrapper import module_source
from .ir import ScheduledProgram
from .options import DEFAULT_OPTIONS, InductorOptions
from .passes import CompileState
from .pipeline import choose_backend, stages_for, verify_state

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
    device: str = "cpu"
    cubins: tuple[Cubin, ...] = ()  # CUDA: the Triton kernels, compiled for ``cuda_arch``
    cuda_arch: int | None = None
    scheduled: ScheduledProgram | None = None  # the program the wrapper runs (for in-process callers)

    @property
    def source_hash(self) -> str:
        h = hashlib.sha256(self.wrapper_source.encode())
        h.update(b"\0" + self.kernel_source.encode() + b"\0" + " ".join(self.kernel_flags).encode())
        for c in self.cubins:
            h.update(b"\0" + c.sha256.encode())
        return h.hexdigest()


def cpp_program(gm: fx.GraphModule, example_inputs: Sequence[Any], slots: Mapping[int, Slot], *,
                options: InductorOptions = DEFAULT_OPTIONS, name: str = "model",
                cuda_arch: int | None = None, writer: type[CppWrapperWriter] | None = None) -> CppProgram:
    """Schedule a functional ATen inference graph and emit its C++ sources (CPU tensors: kiln's C++
    kernels; CUDA tensors, real or fake: Triton kernels compiled into cubins for ``sm_<cuda_arch>``).

    ``slots``: for each graph input position, whether the caller passes it as an input or a constant
    (and which). ``writer``: the C++ wrapper's writer (a subclass of CppWrapperWriter; kiln.compile's
    in-process wrapper). Raises ``CppWrapperUnsupported`` for what cannot run without Python."""
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if devices - {"cpu", "cuda"} or len(devices) > 1:
        raise CppWrapperUnsupported(f"the C++ wrapper runs graphs on one device, CPU or CUDA (inputs on {sorted(devices)})")
    cuda = devices == {"cuda"}
    if cuda and cuda_arch is None:
        raise CppWrapperUnsupported("a CUDA graph needs cuda_arch, the GPU architecture its kernels are compiled for")
    if not cuda and options.cpu_backend != "cpp":
        raise CppWrapperUnsupported("the C++ wrapper needs cpu_backend='cpp'")
    options = options.replace(memory_arena=False, **({"pad_matmuls": False} if cuda else {}))
    backend = choose_backend(example_inputs, options)
    state = CompileState(gm, tuple(example_inputs), options, name, backend)
    verify = options.verify if options.verify is not None else GRAPH_KNOBS.verify
    stages = stages_for(backend)
    passes = stages[:[p.name for p in stages].index(_UNTIL)]
    s = run_pipeline(passes, state, None, [VerifyAfterPass(verify_state)] if verify else []).value
    assert s.scheduled is not None and s.program is not None
    kernels = s.scheduled.launched()  # a kernel group is one C function
    layouts = s.program.layouts()
    n_ext = sum(1 for st in s.scheduled.steps if not hasattr(st.work, "nodes"))
    texts = dict(s.texts)
    if s.fallbacks:
        texts["fallbacks"] = "\n".join(s.fallbacks)
    outputs = tuple(output_specs(s.program))
    if cuda:
        assert isinstance(s.backend, TritonBackend) and cuda_arch is not None
        generated, spans = s.backend.generate(s.scheduled, layouts, options, s.tuner)
        try:
            cubins, sites = compile_cubins(generated, layouts, cuda_arch)
        except CubinUnsupported as e:
            raise CppWrapperUnsupported(str(e)) from e
        by_kernel = {site.kernel: site for site in sites}
        launches = {k: [by_kernel[g.name] for g in generated[a:b] if g.name in by_kernel] for k, a, b in spans}
        wrapper = cpp_wrapper_source(s.scheduled, {}, dict(slots), CudaKernels(cubins, launches, cuda_arch), writer)
        texts["triton_kernels"] = module_source(generated) if generated else ""
        texts["cpp_wrapper"] = wrapper
        return CppProgram(name, wrapper, "", (), (), outputs, len(generated), n_ext, texts, device="cuda",
                          cubins=tuple(cubins), cuda_arch=cuda_arch, scheduled=s.scheduled)
    source, symbols = library_source(kernels, layouts, options) if kernels else ("", {})
    wrapper = cpp_wrapper_source(s.scheduled, symbols, dict(slots), None, writer)
    flags = tuple(f for f in options.cpp_flags if f != "-shared")
    texts["cpp_wrapper"] = wrapper
    return CppProgram(name, wrapper, source, flags, tuple(options.link_flags), outputs, len(kernels), n_ext, texts,
                      scheduled=s.scheduled)


__all__ = ["CppProgram", "CppWrapperUnsupported", "Slot", "cpp_program"]
