"""``aot``: the autograd stage behind the backend contract, and the ready ``aot_eager`` backend."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from kiln.graph import (
    CompiledGraph,
    ExampleInput,
    PortableProgram,
    StageTime,
    annotate,
    annotations_of,
    dump,
    emit,
    enabled,
    keeping_texts,
    log,
    new_graph_id,
    print_graph,
)

from .joint import JointGraph, module_state_names
from .knobs import KNOBS
from .partition import Partitioned, PartitionerName, tangent_dependencies
from .pipeline import AotOptions, run_aot_pipeline
from .portable import render_graph_module, training_program
from .signature import GraphSignature
from .tracer import Decompositions
from .wrapper import make_inference_callable, make_training_callable

Compiler = Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]]


def _example_vals(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _portable_of(compiled: Callable[..., Any]) -> PortableProgram | None:
    return compiled.portable if isinstance(compiled, CompiledGraph) else None


@dataclass
class AotResult:
    """What ``aot`` built: the traced graphs plus the compiled callables (for inspection and tests)."""

    joint: JointGraph
    partitioned: Partitioned | None
    seconds: float


def _log_graphs(gid: str, joint: JointGraph, parts: Partitioned | None) -> None:
    if not enabled("aot_graphs") and not keeping_texts():
        return
    if parts is None:
        text = f"# inference graph {gid}\n{print_graph(joint.gm)}"
        dump(gid, "aot_inference", text)
    else:
        text = (f"# {gid}: partitioner={parts.partitioner} saved_tensors={parts.n_saved} "
                f"saved_bytes={parts.saved_bytes}\n# ---- forward ----\n{print_graph(parts.fw_gm)}\n"
                f"# ---- backward ----\n{print_graph(parts.bw_gm)}")
        dump(gid, "aot_forward", print_graph(parts.fw_gm))
        dump(gid, "aot_backward", print_graph(parts.bw_gm))
    if enabled("aot_graphs"):
        log("aot_graphs").info("%s", text)


def aot(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput], *, fw_compiler: Compiler,
        bw_compiler: Compiler | None = None, inference_compiler: Compiler | None = None,
        decompositions: Decompositions | None = None,
        partitioner: PartitionerName = "min_cut", recompute_norms: bool = KNOBS.recompute_norms) -> CompiledGraph:
    """Compile a torch-dialect graph for training or inference (the standard backend contract).

    Traces a joint forward+backward ATen graph when grad mode is on and some input (or lifted
    parameter) requires grad, partitions it, and compiles the two halves with ``fw_compiler`` and
    ``bw_compiler``; otherwise traces one forward graph for ``inference_compiler``. Example inputs may
    be real or fake tensors; nothing real runs while compiling. ``recompute_norms``: training
    BatchNorm outputs become their pointwise expression so the backward may recompute what follows
    them instead of saving it (recompute.py; results equal eager's up to rounding, not bitwise).
    """
    t0 = time.perf_counter()
    opts = AotOptions(partitioner=partitioner, decompositions=decompositions, recompute_norms=recompute_norms)
    joint, parts = run_aot_pipeline(gm, example_inputs, opts)
    gid = new_graph_id("aot")
    emit(StageTime("autograd", time.perf_counter() - t0, graph=gid))  # joint trace + partition
    _log_graphs(gid, joint, parts)
    sig = joint.signature
    texts: dict[str, str] = {}
    # which outputs are new values of which inputs (written back after the call): a compiler may update
    # those inputs in place instead (kiln.inductor does for a KV-cache index_put, an optimizer step, a
    # training BatchNorm's running statistics)
    mutations = tuple((sig.n_graph_outputs + j, idx) for j, idx in enumerate(sig.mutated_inputs))
    if parts is None:
        annotate(joint.gm, replace(annotations_of(joint.gm), input_mutations=mutations))
        compiled = (inference_compiler or fw_compiler)(joint.gm, _example_vals(joint.gm))
        fn = make_inference_callable(sig, compiled)
        texts["aot_inference"] = print_graph(joint.gm)
        p = _portable_of(compiled)
        portable = training_program(sig, p, None) if p and sig.n_lifted == 0 else None
        later = _later(compiled, sig) if portable is not None else None
    else:
        fw, bw = _compile_pair(parts, fw_compiler, bw_compiler or fw_compiler, mutations)
        grad_deps = tangent_dependencies(parts.bw_gm, parts.n_saved + parts.n_saved_sizes)
        fn = make_training_callable(sig, fw, bw, parts.n_saved, grad_deps, parts.n_saved_sizes)
        texts["aot_forward"] = print_graph(parts.fw_gm)
        texts["aot_backward"] = print_graph(parts.bw_gm)
        later = None
        pf, pb = _portable_of(fw), _portable_of(bw)
        portable = training_program(sig, pf, pb, grad_deps, parts.n_saved_sizes) \
            if pf and pb and sig.n_lifted == 0 else None
    if sig.n_lifted:
        fn = _with_module_state(gm, fn)
    # (not one reading this module's own tensors: a graph cache hit may hand it to another module)
    improves = not sig.n_lifted and any(isinstance(c, CompiledGraph) and c.improves
                                        for c in ((compiled,) if parts is None else (fw, bw)))
    return CompiledGraph(fn, "aot", texts, portable, aot=AotResult(joint, parts, time.perf_counter() - t0),
                         later=later, improves=improves)


def _later(compiled: Callable[..., Any], sig: GraphSignature) -> Any:
    """The inference program around the inner compiler's later portable form (CompiledGraph.later)."""
    inner = compiled.later if isinstance(compiled, CompiledGraph) else None
    if inner is None:
        return None

    def later(callback: Callable[[PortableProgram], None]) -> None:
        inner(lambda p: callback(training_program(sig, p, None)))
    return later


def _with_module_state(gm: fx.GraphModule, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Graphs that read parameters/buffers through get_attr get the live tensors prepended per call."""
    names = module_state_names(gm)
    params = dict(gm.named_parameters())

    def run(*args: Any) -> Any:
        state = [params[n] if n in params else gm.get_buffer(n) for n in names]
        return fn(*state, *args)
    return run


# ---- aot_eager ---------------------------------------------------------------------------------

def run_graph_compiler(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
    """A compiler that just runs the ATen graph (fx GraphModule call), with a portable form."""
    try:
        portable: PortableProgram | None = render_graph_module(gm)
    except ValueError:
        portable = None
    return CompiledGraph(gm, "eager_aten", {"aten": print_graph(gm)}, portable)


def aot_eager(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput], **kwargs: Any) -> CompiledGraph:
    """A ready backend: ``aot`` whose compilers run the ATen graphs as they are."""
    kwargs.setdefault("fw_compiler", run_graph_compiler)
    kwargs.setdefault("partitioner", KNOBS.partitioner)
    # aot_eager runs eager's own kernels, so its results equal eager's bitwise; the BatchNorm rewrite
    # would compute the normalized output with other rounding (a ReLU mask can flip)
    kwargs.setdefault("recompute_norms", False)
    return aot(gm, example_inputs, **kwargs)


def _compile_pair(parts: Any, fw_compiler: Compiler, bw_compiler: Compiler,
                  mutations: tuple[tuple[int, int], ...]) -> tuple[Any, Any]:
    """Compile the forward, then the backward for the strides the forward really returns. The forward
    returns the new values of the inputs it mutates after its outputs, as an inference graph does
    (``mutations``: GraphAnnotations.input_mutations).

    The saved activations only travel from the forward to the backward, so the forward's compiler may
    choose their layout (``GraphAnnotations.layout_free_outputs``: kiln.inductor keeps convolution
    activations channels-last instead of copying them back to NCHW); a compiled result that reports
    ``output_strides`` has the backward's saved placeholders retyped to match, before it is compiled."""
    fw_out = next(n for n in parts.fw_gm.graph.nodes if n.op == "output").args[0]
    n_out = len(fw_out) - parts.n_saved_sizes  # the saved sizes (ints) come last
    annotate(parts.fw_gm, replace(annotations_of(parts.fw_gm), input_mutations=mutations,
                                  layout_free_outputs=tuple(range(n_out - parts.n_saved, n_out))))
    fw = fw_compiler(parts.fw_gm, _example_vals(parts.fw_gm))
    strides = fw.output_strides if isinstance(fw, CompiledGraph) else None
    if strides is not None:
        saved = [n for n in parts.bw_gm.graph.nodes if n.op == "placeholder"][:parts.n_saved]
        for ph, st in zip(saved, list(strides)[n_out - parts.n_saved:n_out]):
            v = ph.meta.get("val")
            if isinstance(v, torch.Tensor) and st is not None and tuple(v.stride()) != tuple(st):
                with v.fake_mode:  # type: ignore[attr-defined]
                    ph.meta["val"] = torch.empty_strided(v.shape, tuple(st), dtype=v.dtype, device=v.device)
    return fw, bw_compiler(parts.bw_gm, _example_vals(parts.bw_gm))

