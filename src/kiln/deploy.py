"""Whole-program export for deployment without Python (``kiln.export``, ``kiln.package``, ``kiln.load_package``).

    exported = kiln.export(model, (x,))                  # capture (fullgraph) + inference ATen graph
    kiln.package(exported, "model_pkg")                  # model.so + weights.safetensors + manifest.json
    model = kiln.load_package("model_pkg")               # the same package, from Python
    // C++: kiln::Runner runner("model_pkg", c10::kCPU); runner.run({x});

``export`` is capture with ``fullgraph`` semantics (a graph break is an error naming the user line)
followed by kiln.autograd's inference trace: one functional ATen graph whose placeholders are either
the caller's tensors (``inputs``) or the module's parameters and buffers and any other tensor the
function read (``constants``, by name). ``package`` hands that graph to kiln.inductor's C++ wrapper
(no Python wrapper) and kiln.runtime.cxx builds and writes the package.

Note: static shapes only. ``dynamic_shapes`` ranges are refused with a clear error until symbolic
sizes reach the generated C++ (then the manifest's guards carry the ranges).
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx

import kiln.capture as capture
import kiln.runtime.cxx as cxx
from kiln.autograd import trace_inference
from kiln.graph import CapturedGraph, KilnError, TensorSpec, print_graph
from kiln.inductor import InductorOptions, inductor_decompositions
from kiln.inductor.cpp_program import CppProgram, CppWrapperUnsupported, Slot, cpp_program

from .aot import _example_inputs, _frame, _output_spec


class ExportError(KilnError):
    """The program cannot be exported as one static inference graph (the message says why and where)."""


@dataclass(frozen=True)
class ExportedInput:
    name: str  # "x", "xs[1]", "batch['ids']"
    source: str  # capture's source: "L['x']"
    spec: TensorSpec


@dataclass(frozen=True)
class ExportedGraph:
    """A whole inference program: one functional ATen graph, its inputs, named constants and outputs."""

    name: str
    captured: CapturedGraph
    graph: fx.GraphModule  # ATen inference graph (placeholders in ``slots`` order)
    inputs: tuple[ExportedInput, ...]
    constants: Mapping[str, torch.Tensor]  # parameters, buffers, other tensors read (contiguous copies)
    slots: tuple[Slot, ...]  # per graph placeholder: the caller's input k or constant k (constants' order)
    outputs: tuple[TensorSpec, ...]
    output_tree: pytree.TreeSpec
    baked: Mapping[str, Any] = field(default_factory=dict)  # non-tensor arguments, fixed at export

    def as_text(self) -> str:
        lines = [f"# exported program {self.name}", "# inputs:"]
        lines += [f"#   {i.name}: {i.spec.as_text()}" for i in self.inputs]
        if self.baked:
            lines += ["# fixed arguments:"] + [f"#   {k} = {v!r}" for k, v in self.baked.items()]
        lines.append(f"# constants ({len(self.constants)}, {sum(t.nbytes for t in self.constants.values())} bytes):")
        lines += [f"#   {n}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for n, t in self.constants.items()]
        lines.append("# outputs:")
        lines += [f"#   {k}: {s.as_text()}" for k, s in enumerate(self.outputs)]
        return "\n".join(lines) + "\n" + print_graph(self.graph)

    def graph_inputs(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        names = list(self.constants)
        return [inputs[s.index] if s.kind == "input" else self.constants[names[s.index]] for s in self.slots]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the exported ATen graph (eagerly, op by op): for checking what a package computes."""
        flat = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        with torch.no_grad():
            outs = self.graph(*self.graph_inputs(flat))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        return pytree.tree_unflatten(outs[:len(self.outputs)], self.output_tree)


_ITEM = re.compile(r"\[('(?:[^'\\]|\\.)*'|\d+)\]")
_CONTAINERS = ("_modules", "_parameters", "_buffers")


def constant_name(source: str) -> str:
    """``L['self']._modules['l']._parameters['weight']`` -> ``l.weight``; other sources keep their keys."""
    parts = [p.strip("'") for p in _ITEM.findall(source)]
    kept = [p for p in parts if p not in _CONTAINERS]
    if source.startswith("L['self']") and kept and kept[0] == "self":
        kept = kept[1:]
    name = ".".join(kept) or re.sub(r"\W+", "_", source)
    return ("G." + name) if source.startswith("G[") else name


def _leaf_sources(name: str, value: Any, src: str, out: dict[str, tuple[str, Any]]) -> None:
    """Every leaf of an argument: capture's source -> (display name, value)."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _leaf_sources(f"{name}[{i}]", v, f"{src}[{i}]", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _leaf_sources(f"{name}[{k!r}]", v, f"{src}[{k!r}]", out)
    else:
        out[src] = (name, value)


def _check_dynamic(dynamic_shapes: Any) -> None:
    if not dynamic_shapes:
        return
    ranges = [(k, d, r) for k, dims in dict(dynamic_shapes).items() for d, r in dict(dims or {}).items()]
    if ranges:
        k, d, r = ranges[0]
        raise ExportError(f"kiln.export: dynamic_shapes asks for input {k!r} dim {d} in range {r}; this kiln exports "
                          "static shapes only (symbolic sizes do not reach the generated C++ yet). Export once per "
                          "shape you serve, or pass dynamic_shapes=None")


def _capture(fn: Callable[..., Any], args: tuple, kwargs: dict) -> CapturedGraph:
    try:
        return capture.capture_graph(fn, args, kwargs)
    except KilnError as e:
        raise ExportError(f"kiln.export: {getattr(fn, '__qualname__', type(fn).__name__)} cannot be captured "
                          f"as one graph:\n{e}\nkiln.export needs the whole program as one graph (no graph "
                          "breaks): rewrite the construct named above") from e


def export(fn: Callable[..., Any], args: tuple | list, kwargs: Mapping[str, Any] | None = None, *,
           dynamic_shapes: Mapping[str, Any] | None = None) -> ExportedGraph:
    """Capture ``fn(*args, **kwargs)`` (a function or an ``nn.Module``) as one static inference graph."""
    _check_dynamic(dynamic_shapes)
    args, kwargs = tuple(args), dict(kwargs or {})
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if isinstance(fn, torch.nn.Module) and fn.training:
        raise ExportError(f"kiln.export: {name} is in training mode; call .eval() first (export makes an "
                          "inference program: dropout off, batch norm with its running statistics)")
    with torch.no_grad():
        captured = _capture(fn, args, kwargs)
    tensor_leaves, baked = _call_leaves(fn, args, kwargs)
    constants, slots = _classify(fn, args, kwargs, captured, tensor_leaves)
    inputs = tuple(ExportedInput(n, src, _spec(v)) for src, n, v in tensor_leaves)
    graph, outputs, tree = _inference_graph(fn, args, kwargs, captured, tensor_leaves, constants, slots)
    return ExportedGraph(name, captured, graph, inputs, constants, tuple(slots), outputs, tree, baked)


def _call_leaves(fn: Callable[..., Any], args: tuple,
                 kwargs: dict) -> tuple[list[tuple[str, str, torch.Tensor]], dict[str, Any]]:
    """The call's tensors as (capture source, display name, value) in argument order, and its other
    arguments by display name (fixed at export)."""
    frame = _frame(fn, args, kwargs)
    leaves: dict[str, tuple[str, Any]] = {}
    skip = {"self"} if isinstance(fn, torch.nn.Module) or inspect.ismethod(fn) else set()
    for p in frame.params:
        if p.name in frame.locals and p.name not in skip:
            _leaf_sources(p.name, frame.locals[p.name], f"L[{p.name!r}]", leaves)
    tensors = [(src, n, v) for src, (n, v) in leaves.items() if isinstance(v, torch.Tensor)]
    return tensors, {n: v for n, v in leaves.values() if not isinstance(v, torch.Tensor)}


def _classify(fn: Callable[..., Any], args: tuple, kwargs: dict, captured: CapturedGraph,
              tensor_leaves: list[tuple[str, str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], list[Slot]]:
    """Each graph input as the caller's tensor k or a named constant (one per distinct tensor: tied
    weights are stored once)."""
    scope = _frame(fn, args, kwargs).scope()
    position = {src: k for k, (src, _, _) in enumerate(tensor_leaves)}
    constants: dict[str, torch.Tensor] = {}
    by_id: dict[int, str] = {}
    slots: list[Slot] = []
    for src, spec in zip(captured.input_sources, captured.input_specs):
        if not isinstance(spec, TensorSpec):
            raise ExportError(f"kiln.export: graph input {src} is a symbolic size; export needs static shapes")
        if src in position:
            slots.append(Slot("input", position[src]))
            continue
        (value,) = _example_inputs((src,), dict(scope["L"]), dict(scope["G"]))
        assert isinstance(value, torch.Tensor)
        if id(value) not in by_id:
            cname = constant_name(src)
            while cname in constants:
                cname += "_"
            by_id[id(value)] = cname
            constants[cname] = value.detach().contiguous()
        slots.append(Slot("constant", list(constants).index(by_id[id(value)])))
    return constants, slots


def _spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec.from_tensor(t.detach())


def _inference_graph(fn: Callable[..., Any], args: tuple, kwargs: dict, captured: CapturedGraph,
                     tensor_leaves: list, constants: dict[str, torch.Tensor],
                     slots: list[Slot]) -> tuple[fx.GraphModule, tuple[TensorSpec, ...], pytree.TreeSpec]:
    names = list(constants)
    example = [tensor_leaves[s.index][2] if s.kind == "input" else constants[names[s.index]] for s in slots]
    example = [t.detach() for t in example]
    with torch.no_grad():
        joint = trace_inference(captured.gm, example, decompositions=inductor_decompositions())
    sig = joint.signature
    if sig.mutated_inputs:
        raise ExportError(f"kiln.export: the program writes into its inputs or buffers ({len(sig.mutated_inputs)} "
                          "mutated); an exported program must be functional (in eval mode, no in-place updates "
                          "of arguments or buffers)")
    bad = [(k, o) for k, o in enumerate(sig.outputs) if o.kind != "graph"]
    if bad:
        k, o = bad[0]
        raise ExportError(f"kiln.export: output {k} is {o.as_text()}, not a value the graph computes (an input, "
                          "a view of one or of another output, or a constant); return a tensor the program "
                          "computes (e.g. add .clone())")
    with torch.no_grad():
        outs = joint.gm(*example)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    graph_outputs = outs[:sig.n_graph_outputs]
    tree = _output_spec(fn, args, kwargs, graph_outputs)
    return joint.gm, tuple(_spec(t) for t in graph_outputs), tree


@dataclass(frozen=True)
class PackageReport:
    path: Path
    codegen_seconds: float
    build: cxx.BuildReport
    library_bytes: int
    weights_bytes: int
    program: CppProgram

    def as_text(self) -> str:
        b = self.build
        return (f"package {self.path}: model.so {self.library_bytes / 1e6:.2f} MB, weights {self.weights_bytes / 1e6:.2f} "
                f"MB; codegen {self.codegen_seconds:.2f} s, build {b.seconds:.1f} s (wrapper {b.wrapper_seconds:.1f} s, "
                f"kernels {b.kernels_seconds:.1f} s, support library {b.support_seconds:.1f} s or cached); "
                f"{self.program.n_kernels} kernels, {self.program.n_externs} ATen calls")


def package(exported: ExportedGraph, path: str | Path, *, device: str = "cpu",
            options: Mapping[str, Any] | None = None) -> PackageReport:
    """Write ``exported`` as a package folder at ``path`` (created; files in it are replaced)."""
    if device != "cpu":
        raise ExportError(f"kiln.package: device {device!r} is not supported yet; packages run on 'cpu'")
    try:
        opts = InductorOptions(**dict(options or {}))
    except TypeError as e:
        raise ExportError(f"kiln.package(options=...): {e}; see kiln.inductor.InductorOptions") from e
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    example = exported.graph_inputs([_example(i.spec) for i in exported.inputs])
    try:
        program = cpp_program(exported.graph, example, dict(enumerate(exported.slots)), options=opts,
                              name=exported.name)
    except CppWrapperUnsupported as e:
        raise ExportError(f"kiln.package: {exported.name} cannot run without Python: {e}") from e
    codegen = time.perf_counter() - t0
    report = cxx.build_model_library(program.wrapper_source, program.kernel_source, folder / cxx.LIBRARY,
                                     kernel_flags=program.kernel_flags, link_flags=program.link_flags,
                                     cxx=opts.cxx, keep_sources=folder / "src")
    cxx.write_safetensors(folder / cxx.WEIGHTS, exported.constants, {"format": "pt", "kiln_graph": exported.name})
    cxx.write_manifest(folder, _manifest_fields(exported, program, device))
    return PackageReport(folder, codegen, report, (folder / cxx.LIBRARY).stat().st_size,
                         (folder / cxx.WEIGHTS).stat().st_size, program)


def _example(spec: TensorSpec) -> torch.Tensor:
    return torch.empty_strided(tuple(spec.shape), tuple(spec.stride), dtype=spec.dtype, device=spec.device)


def _manifest_fields(exported: ExportedGraph, program: CppProgram, device: str) -> dict[str, Any]:
    inputs = [cxx.tensor_spec(i.name, i.spec.shape, i.spec.stride, i.spec.dtype) for i in exported.inputs]
    outputs = [cxx.tensor_spec(f"output{k}", shape, stride, dtype) for k, (shape, stride, dtype)
               in enumerate(program.outputs)]
    constants = [cxx.tensor_spec(n, t.shape, t.stride(), t.dtype) for n, t in exported.constants.items()]
    guards = [{"kind": "tensor_match", "input": i.name, "dtype": cxx.dtype_name(i.spec.dtype),
               "shape": list(i.spec.shape), "device": device} for i in exported.inputs]
    guards += [{"kind": "constant_argument", "input": k, "value": repr(v)} for k, v in exported.baked.items()]
    return {
        "graph": exported.name, "device": device, "abi_version": program.abi_version,
        "built_for": cxx.built_for(device, program.kernel_flags),
        "inputs": inputs, "outputs": outputs, "constants": constants, "guards": guards,
        "output_tree": pytree.treespec_dumps(exported.output_tree),
        "source_sha256": program.source_hash,
    }


def load_package(path: str | Path) -> cxx.PackagedModel:
    """A package as a Python callable over its model.so (nothing is generated or compiled)."""
    return cxx.load_package(path)
