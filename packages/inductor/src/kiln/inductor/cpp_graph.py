"""``InductorOptions(wrapper="cpp")``: an inference graph's steps as a C++ library called in-process.

Note: why. A compiled language model is host-bound when its Python wrapper costs more than its kernels'
device time: each Python->ATen call (a matmul, a view for it) costs 12-20 us of host time on an H200's
host, the same call from C++ a few. kiln.package's C++ wrapper (codegen/cpp_wrapper) already runs a
schedule's kernels and ATen calls from C++; here the same wrapper, with every graph input passed per call
(parameters are not baked in: they may be updated in place or replaced between calls), is built into the
compile cache (kiln.runtime.cxx.build_graph_library) and called through its C ABI by ctypes
(kiln.runtime.cxx.GraphLibrary, which releases the GIL for the call).

``compile_cpp_graph`` raises ``CppWrapperUnsupported`` for what this path cannot run (symbolic sizes,
non-tensor inputs or outputs, an op with no libtorch form, more than one device, a GPU it cannot name the
architecture of); compile_graph logs the reason in perf_hints and compiles the Python wrapper instead.
The caller (kiln.compile's inductor backend) asks for it only for inference graphs in default mode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from kiln.graph import CompiledGraph, PortableProgram, dump, new_graph_id
from kiln.runtime.cxx import GraphLibrary, build_graph_library

from .codegen.cpp_wrapper import CppWrapperUnsupported, Slot
from .codegen.cpp_wrapper.graph_call import GraphCallWriter, output_plan
from .codegen.wrapper import REQUIRES
from .cpp_program import cpp_program
from .options import InductorOptions

SOURCE = '''"""kiln.inductor C++ wrapper of graph {name!r}: model.so (FILES) called through its C ABI."""
from kiln.runtime.cxx import GraphLibrary as _GraphLibrary

_GRAPH = _GraphLibrary(FILES, {plan!r}, {n_inputs}, {device!r})
call_owned = _GRAPH.call_owned


def call(args):
    return call_owned(list(args))
'''


def _device(example_inputs: Sequence[Any]) -> torch.device:
    devices = set()
    for k, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise CppWrapperUnsupported(f"input {k} is a {type(x).__name__}, not a tensor")
        if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(), x.storage_offset())):
            raise CppWrapperUnsupported("the graph has symbolic sizes (the C++ wrapper is compiled for static shapes)")
        devices.add(x.device)
    if len(devices) != 1:
        raise CppWrapperUnsupported(f"the C++ wrapper runs a graph on one device (inputs on {sorted(map(str, devices))})")
    (dev,) = devices
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    return dev


def _cuda_arch(dev: torch.device) -> int | None:
    if dev.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise CppWrapperUnsupported("a CUDA graph compiled without a GPU here: its cubins need the GPU's architecture")
    major, minor = torch.cuda.get_device_capability(dev)
    return major * 10 + minor


def compile_cpp_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: InductorOptions,
                      name: str = "graph") -> CompiledGraph:
    """``gm`` (a functional ATen inference graph, its constants lifted to inputs) as a C++ wrapper library
    whose compiled graph takes the same inputs and returns the same outputs as the Python wrapper's."""
    t0 = time.perf_counter()
    dev = _device(example_inputs)
    slots = {k: Slot("input", k) for k in range(len(example_inputs))}
    program = cpp_program(gm, example_inputs, slots, options=options, name=name, cuda_arch=_cuda_arch(dev),
                          writer=GraphCallWriter)
    assert program.scheduled is not None
    plan = output_plan(program.scheduled)
    t1 = time.perf_counter()
    files = build_graph_library(program.wrapper_source, program.kernel_source, kernel_flags=program.kernel_flags,
                                link_flags=program.link_flags, cxx=options.cxx,
                                cubins={c.file_name: c.binary for c in program.cubins}, cuda=dev.type == "cuda")
    t2 = time.perf_counter()
    source = SOURCE.format(name=name, plan=[p.as_json() for p in plan], n_inputs=len(example_inputs),
                           device=str(dev))
    ns: dict[str, Any] = {"FILES": files, "FILES_DIR": None, "__name__": f"kiln_cpp_graph_{name}"}
    exec(compile(source, f"<kiln-inductor cpp wrapper {name}>", "exec"), ns)  # noqa: S102 - generated here
    graph: GraphLibrary = ns["_GRAPH"]
    texts = dict(program.texts)
    texts["output_code"] = source
    texts["timings"] = (f"codegen {1e3 * (t1 - t0):.1f} ms, build {1e3 * (t2 - t1):.1f} ms (or cached), "
                        f"load {1e3 * (time.perf_counter() - t2):.1f} ms")
    graph_id = new_graph_id(name)
    for stage, text in texts.items():
        dump(graph_id, stage, text)
    return CompiledGraph(graph, "inductor(cpp wrapper)", texts, PortableProgram(source, files, REQUIRES),
                         output_strides=tuple(p.stride for p in plan), loop_program=program.scheduled.program,
                         scheduled=program.scheduled)
