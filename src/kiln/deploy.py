"""Whole-program export for deployment without Python (``kiln.export``, ``kiln.package``, ``kiln.load_package``).

    exported = kiln.export(model, (x,))                  # capture (fullgraph) + inference ATen graph
    exported = kiln.export(model, (x,), dynamic_shapes={"x": {0: (2, 64)}})  # one program for x.shape[0] in [2, 64]
    kiln.package(exported, "model_pkg")                  # model.so + weights.safetensors + manifest.json
    kiln.package(exported, "gpu_pkg", device="cuda")     # + kernels/*.cubin (sm of this GPU, or
                                                         #   options={"cuda_arch": 90} without one)
    model = kiln.load_package("model_pkg")               # the same package, from Python
    // C++: kiln::Runner runner("model_pkg", c10::kCPU); runner.run({x});

``export`` is capture with ``fullgraph`` semantics (a graph break is an error naming the user line)
followed by kiln.autograd's inference trace: one functional ATen graph whose placeholders are either
the caller's tensors (``inputs``) or the module's parameters and buffers and any other tensor the
function read (``constants``, by name). ``package`` hands that graph to kiln.inductor's C++ wrapper
(no Python wrapper) and kiln.runtime.cxx builds and writes the package.

A CUDA package may come from a program exported on CPU: the graph's device arguments (``torch.arange(...,
device=x.device)``) are moved to CUDA and the schedule is made on fake CUDA tensors, so the package,
cubins included, builds on a machine without a GPU for the ``cuda_arch`` asked for.

Dynamic shapes: ``dynamic_shapes`` names, per input, the dims that vary and their range ``(min, max)``.
Those dims are symbolic from capture to the generated C++, which computes every size from them (a CUDA
package's cubins take them as int32 parameters, compiled unspecialised); the manifest lists each size
symbol with the input dim it is read from and its range, and the relations the program assumed between
sizes (two inputs sharing a dim, a reshape's divisibility), which both runners check before running. A
range starts at 2 or more: sizes 0 and 1 are specialised (a size-1 dim broadcasts), so they are served
by another export. deploy_shapes.py reads and checks them.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import operator
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import kiln.capture as capture
import kiln.runtime.cxx as cxx
from kiln.autograd import trace_inference
from kiln.graph import CapturedGraph, KilnError, TensorSpec, print_graph
from kiln.inductor import InductorOptions, inductor_decompositions
from kiln.inductor.cpp_program import CppProgram, CppWrapperUnsupported, Slot, cpp_program

from .aot import _example_inputs, _frame, _output_spec
from .deploy_shapes import (
    ExportError,
    SizeSymbol,
    check_asked,
    check_ranges,
    dynamic_dims,
    marked,
    size_symbols,
    traced_specs,
)


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
    sizes: tuple[SizeSymbol, ...] = ()  # symbolic dims (dynamic_shapes), in the order model.so takes them

    def describe(self, z: SizeSymbol) -> str:
        return f"input {self.inputs[z.input].name!r} dim {z.dim}"

    def as_text(self) -> str:
        lines = [f"# exported program {self.name}", "# inputs:"]
        lines += [f"#   {i.name}: {i.spec.as_text()}" for i in self.inputs]
        if self.sizes:
            lines.append("# symbolic sizes:")
            for z in self.sizes:
                same = str(self.inputs[z.input].spec.shape[z.dim])
                also = f" (the program's {same})" if same != z.symbol else ""
                lines.append(f"#   {z.symbol} = {self.describe(z)}, in [{z.min}, {z.max}]{also}")
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


def _capture(fn: Callable[..., Any], args: tuple, kwargs: dict) -> CapturedGraph:
    try:
        return capture.capture_graph(fn, args, kwargs)
    except KilnError as e:
        raise ExportError(f"kiln.export: {getattr(fn, '__qualname__', type(fn).__name__)} cannot be captured "
                          f"as one graph:\n{e}\nkiln.export needs the whole program as one graph (no graph "
                          "breaks): rewrite the construct named above") from e


def export(fn: Callable[..., Any], args: tuple | list, kwargs: Mapping[str, Any] | None = None, *,
           dynamic_shapes: Mapping[str, Any] | None = None) -> ExportedGraph:
    """Capture ``fn(*args, **kwargs)`` (a function or an ``nn.Module``) as one inference graph.

    ``dynamic_shapes``: per tensor input (by name: ``"x"``, ``"xs[1]"``), the dims that vary and their
    ranges, ``{"x": {0: (2, 64)}}``; other dims are static."""
    args, kwargs = tuple(args), dict(kwargs or {})
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if isinstance(fn, torch.nn.Module) and fn.training:
        raise ExportError(f"kiln.export: {name} is in training mode; call .eval() first (export makes an "
                          "inference program: dropout off, batch norm with its running statistics)")
    tensor_leaves, baked = _call_leaves(fn, args, kwargs)
    dynamic = dynamic_dims(dynamic_shapes, tensor_leaves, name)
    if dynamic:
        args, kwargs = marked(args, kwargs, tensor_leaves, dynamic)
        tensor_leaves, baked = _call_leaves(fn, args, kwargs)
    with torch.no_grad():
        captured = _capture(fn, args, kwargs)
    check_asked(captured, tensor_leaves, dynamic, name)
    sizes = size_symbols(captured, tensor_leaves, name)
    constants, slots = _classify(fn, args, kwargs, captured, tensor_leaves)
    specs = traced_specs(captured) if sizes else {}
    inputs = tuple(ExportedInput(n, src, _input_spec(specs.get(src), v)) for src, n, v in tensor_leaves)
    graph, outputs, tree = _inference_graph(fn, args, kwargs, captured, tensor_leaves, constants, slots)
    exported = ExportedGraph(name, captured, graph, inputs, constants, tuple(slots), outputs, tree, baked, sizes)
    check_ranges(captured, sizes, exported.describe, f"kiln.export({name})")
    return exported


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


def _input_spec(traced: TensorSpec | None, value: torch.Tensor) -> TensorSpec:
    """An input's spec: its example's, with the capture's symbols in dynamic dims."""
    return dataclasses.replace(traced, requires_grad=False) if traced is not None else _spec(value)


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
    # where the outputs' sizes vary, the traced values' specs (symbolic); else the example's outputs'
    (ret,) = [n for n in joint.gm.graph.nodes if n.op == "output"]
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in pytree.tree_leaves(ret.args[0])]
    traced = [_spec(v) if isinstance(v, torch.Tensor) else None for v in vals[:sig.n_graph_outputs]]
    specs = tuple(s if s is not None and s.is_dynamic else _spec(t) for s, t in zip(traced, graph_outputs))
    return joint.gm, specs, tree


@dataclass(frozen=True)
class PackageReport:
    path: Path
    codegen_seconds: float
    build: cxx.BuildReport
    library_bytes: int
    weights_bytes: int
    program: CppProgram
    cubin_bytes: int = 0

    def as_text(self) -> str:
        b = self.build
        cubins = (f", {len(self.program.cubins)} cubins {self.cubin_bytes / 1e6:.2f} MB for sm_{self.program.cuda_arch}"
                  if self.program.device == "cuda" else "")
        return (f"package {self.path} ({self.program.device}): model.so {self.library_bytes / 1e6:.2f} MB, weights "
                f"{self.weights_bytes / 1e6:.2f} MB{cubins}; codegen {self.codegen_seconds:.2f} s, build {b.seconds:.1f} s "
                f"(wrapper {b.wrapper_seconds:.1f} s, kernels {b.kernels_seconds:.1f} s, support library "
                f"{b.support_seconds:.1f} s or cached); {self.program.n_kernels} kernels, {self.program.n_externs} ATen calls")


DEVICES = ("cpu", "cuda")


def package(exported: ExportedGraph, path: str | Path, *, device: str | torch.device = "cpu",
            options: Mapping[str, Any] | None = None) -> PackageReport:
    """Write ``exported`` as a package folder at ``path`` (created; files in it are replaced).

    ``device="cuda"``: Triton kernels compiled into cubins for ``options["cuda_arch"]`` (90: H100/H200;
    default: this process's GPU). Other ``options`` are kiln.inductor.InductorOptions fields."""
    device = str(device).partition(":")[0]  # "cuda:1": a package is for a device type; the index is chosen at load
    if device not in DEVICES:
        raise ExportError(f"kiln.package: device {device!r} is not supported; packages run on 'cpu' or 'cuda'")
    options = dict(options or {})
    arch = _cuda_arch(options.pop("cuda_arch", None)) if device == "cuda" else None
    if "cuda_arch" in options or (device == "cpu" and arch is not None):
        raise ExportError("kiln.package: options['cuda_arch'] is for device='cuda'")
    try:
        opts = InductorOptions(**options)
    except TypeError as e:
        raise ExportError(f"kiln.package(options=...): {e}; see kiln.inductor.InductorOptions") from e
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    graph, example = _graph_for(exported, device)
    named = [(z.symbol, exported.describe(z)) for z in exported.sizes]
    try:
        program = cpp_program(graph, example, dict(enumerate(exported.slots)), options=opts, name=exported.name,
                              cuda_arch=arch, size_symbols=named)
    except CppWrapperUnsupported as e:
        raise ExportError(f"kiln.package: {exported.name} cannot run without Python on {device}: {e}") from e
    _check_not_specialised(exported, program)
    check_ranges(exported.captured, exported.sizes, exported.describe, f"kiln.package({exported.name})")
    codegen = time.perf_counter() - t0
    report = cxx.build_model_library(program.wrapper_source, program.kernel_source, folder / cxx.LIBRARY,
                                     kernel_flags=program.kernel_flags, link_flags=program.link_flags,
                                     cxx=opts.cxx, keep_sources=folder / "src", cuda=device == "cuda")
    cxx.write_safetensors(folder / cxx.WEIGHTS, exported.constants, {"format": "pt", "kiln_graph": exported.name})
    cubins = cxx.write_cubins(folder, {c.file_name: c.binary for c in program.cubins}) if device == "cuda" else []
    triton_source = folder / "src" / "triton_kernels.py"  # what the cubins were compiled from, for reading
    triton_source.unlink(missing_ok=True)
    if device == "cuda":
        triton_source.write_text(program.texts.get("triton_kernels", ""))
    cxx.write_manifest(folder, _manifest_fields(exported, program, device), extra_files=cubins)
    return PackageReport(folder, codegen, report, (folder / cxx.LIBRARY).stat().st_size,
                         (folder / cxx.WEIGHTS).stat().st_size, program, sum(len(c.binary) for c in program.cubins))


def _cuda_arch(asked: Any) -> int:
    """The sm the cubins are compiled for: ``asked`` (90, "90", "sm_90"), else this process's GPU's."""
    if asked is None:
        if not torch.cuda.is_available():
            raise ExportError("kiln.package(device='cuda'): there is no GPU here to take the architecture from; "
                              "name it: options={'cuda_arch': 90} (H100/H200), 80 (A100), 89 (L4/L40), ...")
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    text = str(asked).lower().removeprefix("sm_").removeprefix("sm")
    if not text.isdigit() or not 50 <= int(text) < 200:
        raise ExportError(f"kiln.package: options['cuda_arch']={asked!r}; expected a compute capability as an "
                          "integer such as 90 (sm_90: H100/H200)")
    return int(text)


def _example(spec: TensorSpec, device: str | torch.device | None = None) -> torch.Tensor:
    return torch.empty_strided(tuple(spec.shape), tuple(spec.stride), dtype=spec.dtype,
                               device=spec.device if device is None else device)


def _graph_for(exported: ExportedGraph, device: str) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The graph and example inputs to schedule for ``device``: CPU, the exported ones; CUDA, a copy whose
    device arguments name CUDA, over fake CUDA tensors (no GPU needed)."""
    if device == "cpu":
        if any(i.spec.device.type != "cpu" for i in exported.inputs):
            raise ExportError(f"kiln.package: {exported.name} was exported with inputs on "
                              f"{exported.inputs[0].spec.device}; a CPU package needs it exported on CPU tensors")
        if exported.sizes:  # the trace's fake tensors, whose sizes are the capture's symbols
            return exported.graph, [n.meta["val"] for n in exported.graph.graph.nodes if n.op == "placeholder"]
        return exported.graph, exported.graph_inputs([_example(i.spec) for i in exported.inputs])
    graph = fx.GraphModule(exported.graph, copy.deepcopy(exported.graph.graph))
    for node in list(graph.graph.nodes):
        node.args, node.kwargs = _on_cuda(node.args), _on_cuda(node.kwargs)
        val = node.meta.pop("val", None)  # recomputed on the fake CUDA inputs
        node.meta.pop("tensor_meta", None)
        if node.op == "call_function" and node.target is _CPU_ATTENTION:
            _generic_attention(graph, node, val[0].stride(), exported.name)
        elif node.op == "call_function" and re.search(r"_for_cpu|mkldnn", str(node.target)):
            raise ExportError(f"kiln.package(device='cuda'): {exported.name} was exported on CPU and its graph calls "
                              f"the CPU-only {node.target}; export it with its module and inputs on a CUDA device")
    graph.graph.eliminate_dead_code()
    graph.recompile()
    if exported.sizes:  # the trace's fake tensors moved to CUDA, in their mode (whose sizes are the symbols)
        vals = [n.meta["val"] for n in exported.graph.graph.nodes if n.op == "placeholder"]
        mode = next(v.fake_mode for v in vals if isinstance(v, FakeTensor))
        with mode:
            return graph, [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") for v in vals]
    names = list(exported.constants)
    with FakeTensorMode(allow_non_fake_inputs=True):
        example = []
        for s in exported.slots:
            if s.kind == "input":
                example.append(_example(exported.inputs[s.index].spec, "cuda"))
            else:
                t = exported.constants[names[s.index]]
                example.append(torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cuda"))
    return graph, example


_CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _generic_attention(graph: fx.GraphModule, node: fx.Node, stride: tuple[int, ...], name: str) -> None:
    """CPU's flash attention (what SDPA traced to on CPU) as ``aten.scaled_dot_product_attention``, which
    picks its CUDA kernel where the package runs, copied into the CPU kernel's output layout (``stride``:
    the exported graph's later views rely on it); only its output may be used (not its logsumexp)."""
    users = list(node.users)
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        raise ExportError(f"kiln.package(device='cuda'): {name} uses the logsumexp of CPU attention; export it on a "
                          "CUDA device")
    q, k, v, *rest = node.args
    dropout = rest[0] if rest else node.kwargs.get("dropout_p", 0.0)
    causal = rest[1] if len(rest) > 1 else node.kwargs.get("is_causal", False)
    with graph.graph.inserting_before(node):
        sdpa = graph.graph.call_function(torch.ops.aten.scaled_dot_product_attention.default,
                                         (q, k, v, node.kwargs.get("attn_mask"), dropout, causal),
                                         {"scale": node.kwargs.get("scale")})
        order = sorted(range(len(stride)), key=lambda d: -stride[d])  # outermost dim first
        back = [order.index(d) for d in range(len(stride))]
        aten = torch.ops.aten
        dense = graph.graph.call_function(aten.clone.default, (graph.graph.call_function(
            aten.permute.default, (sdpa, order)),), {"memory_format": torch.contiguous_format})
        out = graph.graph.call_function(aten.permute.default, (dense, back))
    for u in users:
        u.replace_all_uses_with(out)
        graph.graph.erase_node(u)
    graph.graph.erase_node(node)


def _on_cuda(value: Any) -> Any:
    """Node arguments with every CPU device (``device=cpu`` of a factory or a copy) replaced by CUDA."""
    def move(v: Any) -> Any:
        return torch.device("cuda") if isinstance(v, torch.device) and v.type == "cpu" else v
    return pytree.tree_map(move, value)


def _check_not_specialised(exported: ExportedGraph, program: CppProgram) -> None:
    """A dynamic dim that the compile fixed to one size is an error, not a package serving that size only."""
    for g in program.size_guards:
        for z in exported.sizes:
            if re.fullmatch(rf"{z.symbol} == \d+|\d+ == {z.symbol}", g.expr):
                raise ExportError(f"kiln.package: {exported.name} fixes {exported.describe(z)} ({g.expr}), "
                                  f"exported to vary in [{z.min}, {z.max}]; leave it out of dynamic_shapes or "
                                  "change the program")


def _dims(xs: Any) -> list[int | str]:
    """Sizes for the manifest: ints, or the expression over the size symbols as text."""
    return [int(x) if isinstance(x, (int, sympy.Integer)) else str(x) for x in xs]


def _input_specs(exported: ExportedGraph, device: str) -> list[dict[str, Any]]:
    """Each input's dtype, shape and stride; symbolic dims by the symbol the program reads (after the
    relations the trace found: two inputs sharing a dim name the same symbol)."""
    traced: dict[int, TensorSpec] = {}
    if exported.sizes:
        vals = [n.meta.get("val") for n in exported.graph.graph.nodes if n.op == "placeholder"]
        traced = {s.index: TensorSpec.from_tensor(v) for s, v in zip(exported.slots, vals)
                  if s.kind == "input" and isinstance(v, torch.Tensor)}
    out = []
    for k, i in enumerate(exported.inputs):
        spec = traced.get(k, i.spec)
        d = cxx.tensor_spec(i.name, [0] * len(spec.shape), [0] * len(spec.stride), spec.dtype, device)
        out.append({**d, "shape": _dims(spec.shape), "stride": _dims(spec.stride)})
    return out


def _manifest_fields(exported: ExportedGraph, program: CppProgram, device: str) -> dict[str, Any]:
    inputs = _input_specs(exported, device)
    outputs = [{**cxx.tensor_spec(f"output{k}", [0] * len(shape), [0] * len(stride), dtype, device),
                "shape": _dims(shape), "stride": _dims(stride)}
               for k, (shape, stride, dtype) in enumerate(program.outputs)]
    constants = [cxx.tensor_spec(n, t.shape, t.stride(), t.dtype, device) for n, t in exported.constants.items()]
    guards = [{"kind": "tensor_match", "input": i["name"], "dtype": i["dtype"], "shape": i["shape"], "device": device}
              for i in inputs]
    guards += [{"kind": "constant_argument", "input": k, "value": repr(v)} for k, v in exported.baked.items()]
    sizes = [{"symbol": z.symbol, "input": z.input, "name": exported.inputs[z.input].name, "dim": z.dim,
              "min": z.min, "max": z.max} for z in exported.sizes]
    guards += [{"kind": "size_range", "input": s["name"], "dim": s["dim"], "symbol": s["symbol"], "min": s["min"],
                "max": s["max"]} for s in sizes]
    guards += [{"kind": "size_relation", "expr": g.expr, "reason": g.reason} for g in program.size_guards]
    assert [z.symbol for z in exported.sizes] == list(program.size_symbols)
    cuda = None
    kernels = []
    if device == "cuda":
        cuda = {"cuda_arch": program.cuda_arch, "torch_cuda": torch.version.cuda,
                "triton": program.cubins[0].launch.triton_version if program.cubins else None}
        kernels = [{"file": f"{cxx.KERNELS}/{c.file_name}", "function": c.function, "sha256": c.sha256,
                    **c.launch.as_json()} for c in program.cubins]
    return {
        "graph": exported.name, "device": device, "abi_version": program.abi_version,
        "built_for": cxx.built_for(device, program.kernel_flags, cuda),
        "inputs": inputs, "outputs": outputs, "constants": constants, "sizes": sizes, "guards": guards,
        "output_tree": pytree.treespec_dumps(exported.output_tree),
        "source_sha256": program.source_hash,
        **({"kernels": kernels} if device == "cuda" else {}),
    }


def load_package(path: str | Path, device: str | torch.device | None = None) -> cxx.PackagedModel:
    """A package as a Python callable over its model.so (nothing is generated or compiled). ``device``:
    where it runs (its manifest's device type; a CUDA package's default is the current CUDA device)."""
    return cxx.load_package(path, device)
