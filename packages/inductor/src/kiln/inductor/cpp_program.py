"""An inference graph as C++ sources over libtorch (no Python), for kiln.package.

``cpp_program(gm, example_inputs, slots)`` runs the inductor pipeline up to the final schedule (the
same passes as ``compile_graph``), then emits the kernels' translation unit (the C++ backend's own
source) and the C++ wrapper's (codegen/cpp_wrapper/writer.py). Building them into one ``model.so`` is
kiln.runtime.cxx's job.

CUDA (example inputs on a CUDA device, real or fake): the Triton backend generates the kernels, which
are compiled ahead of time into cubins for ``cuda_arch`` (codegen/triton/cubins.py, no GPU needed), and
the wrapper launches them through the CUDA driver API (kiln/model_support_cuda.h). Large misaligned
matmuls are not padded (``pad_matmuls``: kiln's padded matmul is a Python-registered op); those whose
result rows are misaligned (an LM head) still run as the Triton matmul template (``misaligned_matmuls``).

Symbolic sizes: example inputs whose FakeTensors have SymInt sizes compile once for every size. The
caller names every size symbol in the order the model library receives their values (``size_symbols``);
the wrapper computes every loop bound, kernel size argument (CUDA: the cubins' int32 size parameters,
compiled unspecialised, and their grids), allocation and extern size from them, and checks every
relation the ShapeEnv holds (capture's, the trace's, this compile's: ``size_guards``) before it runs.
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
from .codegen.cpp.exprs import cindex
from .codegen.cpp_wrapper import (
    ABI_VERSION,
    CppWrapperUnsupported,
    CppWrapperWriter,
    CudaKernels,
    SizeArgs,
    Slot,
    cpp_wrapper_source,
    output_specs,
)
from .codegen.triton.backend import TritonBackend
from .codegen.triton.cubins import Cubin, CubinUnsupported, compile_cubins
from .codegen.triton.printer import python_index
from .codegen.triton.wrapper import module_source
from .ir import DynamicShapeUnsupported, LoopProgram, ScheduledProgram, SizeGuard, size_symbols_of
from .options import DEFAULT_OPTIONS, InductorOptions
from .passes import CompileState
from .pipeline import choose_backend, stages_for, verify_state
from .size_guards import relation_source, shape_env_of, shape_relations

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
    # (shape, stride, dtype); symbolic sizes are sympy expressions over ``size_symbols``
    outputs: tuple[tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype], ...]
    n_kernels: int
    n_externs: int
    texts: Mapping[str, str] = field(default_factory=dict)
    abi_version: int = ABI_VERSION
    device: str = "cpu"
    cubins: tuple[Cubin, ...] = ()  # CUDA: the Triton kernels, compiled for ``cuda_arch``
    cuda_arch: int | None = None
    size_symbols: tuple[str, ...] = ()  # the model library's size arguments, in order
    size_guards: tuple[SizeGuard, ...] = ()  # relations between them that model.so checks per call
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
                cuda_arch: int | None = None, size_symbols: Sequence[tuple[str, str]] = (),
                writer: type[CppWrapperWriter] | None = None, guarded: bool = False) -> CppProgram:
    """Schedule a functional ATen inference graph and emit its C++ sources (CPU tensors: kiln's C++
    kernels; CUDA tensors, real or fake: Triton kernels compiled into cubins for ``sm_<cuda_arch>``).

    ``slots``: for each graph input position, whether the caller passes it as an input or a constant
    (and which). ``size_symbols``: for symbolic example inputs, every size symbol as (name, what it is,
    e.g. "input 'x' dim 0"), in the order model.so receives their values. ``writer``: the C++ wrapper's
    writer (a subclass of CppWrapperWriter; kiln.compile's in-process wrapper). ``guarded``: the caller
    checks the ShapeEnv's relations before every call (kiln.compile's capture guards), so a relation over
    a size symbol the program does not take (an int argument since specialised) is left to it. Raises
    ``CppWrapperUnsupported`` for what cannot run without Python."""
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if devices - {"cpu", "cuda"} or len(devices) > 1:
        raise CppWrapperUnsupported(f"the C++ wrapper runs graphs on one device, CPU or CUDA (inputs on {sorted(devices)})")
    cuda = devices == {"cuda"}
    if cuda and cuda_arch is None:
        raise CppWrapperUnsupported("a CUDA graph needs cuda_arch, the GPU architecture its kernels are compiled for")
    symbolic = shape_env_of(example_inputs) is not None
    if not cuda and options.cpu_backend != "cpp":
        raise CppWrapperUnsupported("the C++ wrapper needs cpu_backend='cpp'")
    options = options.replace(memory_arena=False, **({"pad_matmuls": False} if cuda else {}))
    backend = choose_backend(example_inputs, options, gm)
    state = CompileState(gm, tuple(example_inputs), options, name, backend)
    verify = options.verify if options.verify is not None else GRAPH_KNOBS.verify
    stages = stages_for(backend)
    passes = stages[:[p.name for p in stages].index(_UNTIL)]
    try:
        s = run_pipeline(passes, state, None, [VerifyAfterPass(verify_state)] if verify else []).value
    except DynamicShapeUnsupported as e:  # kiln.compile would run this graph through ATen; a package cannot
        raise CppWrapperUnsupported(f"kiln.inductor cannot compile it for symbolic sizes ({e}); make those dims "
                                    "static (export once per size)") from e
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
            cubins, sites = compile_cubins(generated, layouts, cuda_arch, pdl=options.pdl)
        except CubinUnsupported as e:
            raise CppWrapperUnsupported(str(e)) from e
        by_kernel = {site.kernel: site for site in sites}
        launches = {k: [by_kernel[g.name] for g in generated[a:b] if g.name in by_kernel] for k, a, b in spans}
        sizes = _size_args(s.program, example_inputs, size_symbols, guarded) if symbolic else SizeArgs()
        wrapper = cpp_wrapper_source(s.scheduled, {}, dict(slots), CudaKernels(cubins, launches, cuda_arch), sizes,
                                     writer)
        texts["triton_kernels"] = module_source(generated) if generated else ""
        texts["cpp_wrapper"] = wrapper
        return CppProgram(name, wrapper, "", (), (), outputs, len(generated), n_ext, texts, device="cuda",
                          cubins=tuple(cubins), cuda_arch=cuda_arch, scheduled=s.scheduled, **_size_fields(sizes))
    source, symbols = library_source(kernels, layouts, options) if kernels else ("", {})
    sizes = _size_args(s.program, example_inputs, size_symbols, guarded) if symbolic else SizeArgs()
    wrapper = cpp_wrapper_source(s.scheduled, symbols, dict(slots), sizes=sizes, writer=writer)
    flags = tuple(f for f in options.cpp_flags if f != "-shared")
    texts["cpp_wrapper"] = wrapper
    return CppProgram(name, wrapper, source, flags, tuple(options.link_flags), outputs, len(kernels), n_ext, texts,
                      scheduled=s.scheduled, **_size_fields(sizes))


def _size_fields(sizes: SizeArgs) -> dict[str, Any]:
    return {"size_symbols": tuple(n for n, _ in sizes.symbols),
            "size_guards": tuple(SizeGuard(text, "a relation the program was traced and compiled for")
                                 for _, text in sizes.relations)}


def _size_args(p: LoopProgram, example_inputs: Sequence[Any], named: Sequence[tuple[str, str]],
               guarded: bool = False) -> SizeArgs:
    """The size symbols model.so takes and the relations it checks, each over those symbols only
    (``guarded``: those over other symbols are the caller's to check)."""
    if not named:
        raise CppWrapperUnsupported("the graph has symbolic sizes; name its size symbols (size_symbols=...)")
    known = {n for n, _ in named}
    used = {z.symbol for z in p.sizes}
    try:
        relations = shape_relations(example_inputs, skip_floats=guarded)
    except DynamicShapeUnsupported as e:
        raise CppWrapperUnsupported(str(e)) from e
    if guarded:  # the caller checks the others
        relations = tuple(r for r in relations if {x.name for x in size_symbols_of(r)} <= known)
    for r in relations:
        used |= {x.name for x in size_symbols_of(r)}
    missing = sorted(used - known)
    if missing:
        raise CppWrapperUnsupported(f"size symbol(s) {', '.join(missing)} are not sizes of the program's inputs "
                                    f"(its inputs' sizes are {', '.join(sorted(known))})")
    try:
        checks = tuple(dict.fromkeys((relation_source(r, cindex, cpp=True), relation_source(r, python_index))
                                     for r in relations))
    except (NotImplementedError, DynamicShapeUnsupported) as e:  # e.g. a guard over a true division
        raise CppWrapperUnsupported(f"a relation between the sizes has no C++ form: {e}") from e
    return SizeArgs(tuple(named), checks)


__all__ = ["CppProgram", "CppWrapperUnsupported", "Slot", "cpp_program"]
