"""``InductorOptions(wrapper="cpp")``: a graph's steps as a C++ library called in-process.

Note: why. A compiled language model is host-bound when its Python wrapper costs more than its kernels'
device time: each Python->ATen call (a matmul, a view for it) costs 12-20 us of host time on an H200's
host, the same call from C++ a few. kiln.package's C++ wrapper (codegen/cpp_wrapper) already runs a
schedule's kernels and ATen calls from C++; here the same wrapper, with every graph input passed per call
(parameters are not baked in: they may be updated in place or replaced between calls), is built into the
compile cache (kiln.runtime.cxx.build_graph_library) and called through its C ABI by ctypes
(kiln.runtime.cxx.GraphLibrary, which releases the GIL for the call).

Symbolic sizes: one library serves every size, as a dynamic package's model.so does (the same writer
over ``SizeArgs``). Each size symbol is read per call from where the graph's inputs first have it, an input
tensor's dim or a SymInt input (``size_arguments``); GraphLibrary passes their values, from which the
library lays out and allocates the outputs (each when its program computes it). The relations the
ShapeEnv holds are capture's guards (checked before the call) and this compile's; the library checks again
those over the sizes it takes, a few integer comparisons (a failure is a GuardError, as the Python
wrapper's size guards are), and leaves those over symbols no input holds any more (an int since specialised) to capture.

``compile_cpp_graph`` raises ``CppWrapperUnsupported`` for what this path cannot run (a size symbol no
input dim or SymInt input holds, non-tensor inputs or outputs, an op with no libtorch form, more than one device, a GPU it cannot name the
architecture of); compile_graph logs the reason in perf_hints and compiles the Python wrapper instead.
kiln.compile asks for it (through the tiered wrapper, tiered.py) for graphs in default mode, inference and
training; a backward's library drops its saved activations after their last use (``InductorOptions.drop_inputs``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch import fx

from kiln.graph import CompiledGraph, PortableProgram, dump, new_graph_id
from kiln.runtime.cxx import FLOAT_ARGUMENT, GraphLibrary, build_graph_library

from .codegen.cpp_wrapper import CppWrapperUnsupported, Slot
from .codegen.cpp_wrapper.graph_call import (
    GraphCallWriter,
    HandedOverInputsWriter,
    OutputPlan,
    held_inputs,
    output_plan,
)
from .codegen.wrapper import REQUIRES
from .cpp_program import CppProgram, cpp_program
from .options import InductorOptions

SOURCE = '''"""kiln.inductor C++ wrapper of graph {name!r}: model.so (FILES) called through its C ABI."""
from kiln.runtime.cxx import GraphLibrary as _GraphLibrary

_GRAPH = _GraphLibrary(FILES, {plan!r}, {n_inputs}, {device!r}, {sizes!r}, {scalars!r}, {held!r})
call_owned = _GRAPH.call_owned


def call(args):
    return call_owned(list(args))
'''


def _device(example_inputs: Sequence[Any]) -> torch.device:
    devices = set()
    for k, x in enumerate(example_inputs):
        if isinstance(x, (torch.SymInt, torch.SymFloat, int, float)) and not isinstance(x, bool):
            continue  # a size or float argument (size_arguments), or a number the graph was specialised to
        if not isinstance(x, torch.Tensor):
            raise CppWrapperUnsupported(f"input {k} is a {type(x).__name__}, not a tensor")
        if isinstance(x.storage_offset(), torch.SymInt):
            raise CppWrapperUnsupported(f"input {k} has a symbolic storage offset")
        devices.add(x.device)
    if len(devices) != 1:
        raise CppWrapperUnsupported(f"the C++ wrapper runs a graph on one device (inputs on {sorted(map(str, devices))})")
    (dev,) = devices
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    return dev


def _symbols(v: torch.SymInt) -> list[str]:
    """The size symbols ``v`` is exactly: its expression's, and the one it had before the ShapeEnv replaced
    it (a relation may name that one: ``Eq(s1, s0)``), as kiln.inductor's SizeTable reads them."""
    names: list[str] = []
    for e in (v.node.expr, getattr(v.node, "_expr", None)):
        if isinstance(e, sympy.Symbol) and e.name not in names:
            names.append(e.name)
    return names


def size_arguments(example_inputs: Sequence[Any]) -> tuple[tuple[str, int, int], ...]:
    """Every size symbol of the inputs with where the library's caller reads it per call, in the order
    the library takes them: ``(symbol, input, dim)``, ``dim`` -1 for a SymInt input (the int itself), -2
    for a SymFloat input (a float argument: kiln.runtime's GraphLibrary passes its IEEE bits). The first
    input dim (or SymInt input) that is exactly the symbol is its source."""
    out: dict[str, tuple[int, int]] = {}
    for k, x in enumerate(example_inputs):
        if isinstance(x, torch.SymFloat) and isinstance(x.node.expr, sympy.Symbol):
            out.setdefault(x.node.expr.name, (k, FLOAT_ARGUMENT))
            continue
        dims = list(enumerate(x.shape)) if isinstance(x, torch.Tensor) else [(-1, x)]
        for d, n in dims:
            if isinstance(n, torch.SymInt):
                for name in _symbols(n):
                    out.setdefault(name, (k, d))
    return tuple((name, k, d) for name, (k, d) in out.items())


def _what(k: int, d: int) -> str:
    if d == FLOAT_ARGUMENT:
        return f"input {k} (a float)"
    return f"input {k} (an int)" if d < 0 else f"input {k} dim {d}"


def _cuda_arch(dev: torch.device) -> int | None:
    if dev.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise CppWrapperUnsupported("a CUDA graph compiled without a GPU here: its cubins need the GPU's architecture")
    major, minor = torch.cuda.get_device_capability(dev)
    return major * 10 + minor


@dataclass(frozen=True)
class CppGraph:
    """A graph's C++ wrapper library, built: its files, the Python source that loads and calls it (a
    portable program's), the output plan, and what cpp_program made."""

    source: str
    files: Mapping[str, bytes]
    plan: tuple[OutputPlan, ...]
    program: CppProgram
    seconds: tuple[float, float]  # codegen, build

    def portable(self) -> PortableProgram:
        return PortableProgram(self.source, dict(self.files), REQUIRES)


def build_cpp_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: InductorOptions,
                    name: str = "graph", cuda_arch: int | None = None) -> CppGraph:
    """Generate and build ``gm``'s C++ wrapper library (a CUDA graph's cubins for ``cuda_arch``, by default
    the GPU's here); nothing is loaded, so a CUDA graph of fake tensors builds without a GPU."""
    t0 = time.perf_counter()
    dev = _device(example_inputs)
    slots = {k: Slot("input", k) for k in range(len(example_inputs))}
    arch = cuda_arch if cuda_arch is not None or dev.type != "cuda" else _cuda_arch(dev)
    sizes = size_arguments(example_inputs)
    program = cpp_program(gm, example_inputs, slots, options=options, name=name, cuda_arch=arch,
                          size_symbols=[(n, _what(k, d)) for n, k, d in sizes], guarded=True,
                          writer=HandedOverInputsWriter if options.drop_inputs else GraphCallWriter)
    assert program.scheduled is not None
    plan = output_plan(program.scheduled)
    t1 = time.perf_counter()
    files = build_graph_library(program.wrapper_source, program.kernel_source, kernel_flags=program.kernel_flags,
                                link_flags=program.link_flags, cxx=options.cxx,
                                cubins={c.file_name: c.binary for c in program.cubins}, cuda=dev.type == "cuda")
    source = SOURCE.format(name=name, plan=[p.as_json() for p in plan], n_inputs=len(example_inputs),
                           device=str(dev), sizes=[list(z) for z in sizes],
                           scalars=[k for k, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)],
                           held=list(held_inputs(program.scheduled)) if options.drop_inputs else [])
    return CppGraph(source, files, plan, program, (t1 - t0, time.perf_counter() - t1))


def compile_cpp_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: InductorOptions,
                      name: str = "graph") -> CompiledGraph:
    """``gm`` (a functional ATen inference graph, its constants lifted to inputs) as a C++ wrapper library
    whose compiled graph takes the same inputs and returns the same outputs as the Python wrapper's."""
    return load_cpp_graph(build_cpp_graph(gm, example_inputs, options=options, name=name), name)


def load_cpp_graph(built: CppGraph, name: str) -> CompiledGraph:
    """The compiled graph calling ``built``'s library (loaded here)."""
    t0 = time.perf_counter()
    ns: dict[str, Any] = {"FILES": built.files, "FILES_DIR": None, "__name__": f"kiln_cpp_graph_{name}"}
    exec(compile(built.source, f"<kiln-inductor cpp wrapper {name}>", "exec"), ns)  # noqa: S102 - generated here
    graph: GraphLibrary = ns["_GRAPH"]
    texts = dict(built.program.texts)
    texts["output_code"] = built.source
    codegen, build = built.seconds
    texts["timings"] = (f"codegen {1e3 * codegen:.1f} ms, build {1e3 * build:.1f} ms (or cached), "
                        f"load {1e3 * (time.perf_counter() - t0):.1f} ms")
    graph_id = new_graph_id(name)
    for stage, text in texts.items():
        dump(graph_id, stage, text)
    scheduled = built.program.scheduled
    assert scheduled is not None
    return CompiledGraph(graph, "inductor(cpp wrapper)", texts, built.portable(),
                         # symbolic strides: None (the caller keeps the traced ones), as the Python wrapper's
                         output_strides=tuple(p.stride if p.static else None for p in built.plan),
                         loop_program=scheduled.program, scheduled=scheduled,
                         size_sources={str(z.symbol): z.source for z in scheduled.program.sizes})
