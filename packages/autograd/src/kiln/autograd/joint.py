"""Tracing a torch-dialect graph into functional ATen graphs: the joint forward+backward graph for
training and a forward-only graph for inference.

The torch graph runs under fx.Interpreter on fake tensors with ``TracingMode`` on top of the dispatch
mode stack, so the autograd engine sits above the recorder: forward ops are recorded as they run, and
``torch.autograd.grad`` on the fake outputs (with fake tangents as extra graph inputs) records the
backward ops into the same graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten

from kiln.decomp import decompose
from kiln.graph import (
    CHECKPOINT_TAG,
    SymbolicSizeError,
    annotate,
    annotations_of,
    autocast_off,
    has_symbolic_sizes,
    is_symbolic,
    print_graph,
    py_expr,
    shape_env_of,
    symbolic_dispatch,
)

from .attention import SDPA_TARGETS, fused_attention
from .cond import is_cond, trace_cond
from .errors import AutogradTraceError
from .signature import GraphSignature, OutputInfo, OutputKind
from .tracer import Decompositions, TracingMode


@dataclass(frozen=True)
class JointGraph:
    """One functional ATen graph: ``(*primals, *tangents) -> (*fw_outputs, *mutated_inputs, *grads)``.

    For an inference graph (``joint=False``) there are no tangents and no gradients.
    """

    gm: fx.GraphModule
    signature: GraphSignature
    joint: bool = True

    @property
    def n_forward_outputs(self) -> int:
        return self.signature.n_graph_outputs + len(self.signature.mutated_inputs)

    def as_text(self) -> str:
        kind = "joint forward+backward" if self.joint else "inference"
        return f"# {kind} graph (aten)\n{self.signature.as_text()}\n{print_graph(self.gm)}"


# ---- inputs ------------------------------------------------------------------------------------

def fake_input(mode: FakeTensorMode, x: Any, where: str) -> Any:
    """A fresh fake leaf with ``x``'s metadata (a real or fake tensor, its sizes symbolic or not), a
    SymInt or SymFloat of ``mode``'s ShapeEnv as it is, or ``x`` itself otherwise."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        if is_symbolic(x) and x.node.shape_env is not mode.shape_env:
            raise AutogradTraceError(f"{where} is a symbolic scalar of another ShapeEnv than the graph's")
        return x
    if not isinstance(x, torch.Tensor):
        return x
    env = shape_env_of([x])
    if env is not None and env is not mode.shape_env:
        raise AutogradTraceError(f"{where} has symbolic sizes {tuple(x.shape)} from another ShapeEnv than "
                                 "the graph's other inputs (one capture makes one ShapeEnv)")
    if isinstance(x, FakeTensor) or x.device.type == "meta":
        with mode:
            f = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=x.device)
    else:
        f = mode.from_tensor(x.detach(), static_shapes=True)
    if x.requires_grad:
        f.requires_grad_(True)
    return f


def _traced_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[Any, list[Any]]:
    """(ShapeEnv or None, the values to trace with): a placeholder whose ``meta["val"]`` has symbolic
    sizes is traced with that value (the real example input of a capture is one size of many), with the
    example input's requires_grad; every other input as given."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    env = shape_env_of(vals)
    if env is None or len(vals) != len(example_inputs):
        return shape_env_of(example_inputs), list(example_inputs)
    out: list[Any] = []
    for x, v in zip(example_inputs, vals):
        if isinstance(v, torch.Tensor) and has_symbolic_sizes(v):
            grad = x.requires_grad if isinstance(x, torch.Tensor) else v.requires_grad
            out.append(v.detach().requires_grad_(grad) if v.requires_grad != grad else v)
        elif is_symbolic(v):
            out.append(v)
        else:
            out.append(x)
    return env, out


# ---- module state lifting ------------------------------------------------------------------------

def module_state_names(gm: fx.GraphModule) -> tuple[str, ...]:
    """Parameters and buffers the graph reads through get_attr/call_module; lifted to leading inputs."""
    return tuple(n for n, _ in gm.named_parameters()) + tuple(n for n, _ in gm.named_buffers())


@contextlib.contextmanager
def swapped_state(gm: fx.GraphModule, values: dict[str, torch.Tensor]) -> Iterator[None]:
    saved: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for name, v in values.items():
            path, _, attr = name.rpartition(".")
            mod = gm.get_submodule(path) if path else gm
            table: dict[str, Any] = mod._parameters if attr in mod._parameters else mod._buffers
            saved.append((table, attr, table[attr]))
            table[attr] = v
        yield
    finally:
        for table, attr, old in reversed(saved):
            table[attr] = old


class _FakeInterpreter(fx.Interpreter):
    """Runs the torch graph; tensor constants read with get_attr become graph constants."""

    def __init__(self, gm: fx.GraphModule, rec: TracingMode, mode: FakeTensorMode) -> None:
        super().__init__(gm)
        self.rec, self.mode = rec, mode

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        val = super().get_attr(target, args, kwargs)
        if isinstance(val, torch.Tensor) and not isinstance(val, FakeTensor):
            fake = self.mode.from_tensor(val, static_shapes=True)
            self.rec.add_constant(val, fake)  # the real tensor itself: ops here would run under fake mode
            return fake
        return val

    def run_node(self, n: fx.Node) -> Any:
        self._node_name = n.name
        region = n.meta.get(CHECKPOINT_TAG)
        if region is None:
            return super().run_node(n)
        graph = self.rec.graph
        last = next(iter(reversed(graph.nodes)), None)
        out = super().run_node(n)
        # the ATen nodes this torch node recorded belong to its torch.utils.checkpoint region: the
        # partitioner recomputes them in the backward (partition.py)
        node = last.next if last is not None else next(iter(graph.nodes), None)
        while node is not None and node.op != "root":
            if node.op == "call_function":
                node.meta[CHECKPOINT_TAG] = region
            node = node.next
        return out

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if is_cond(target):
            return trace_cond(self._run_branch, self.rec, self._node_name, args, kwargs)
        if target in SDPA_TARGETS:  # CUDA attention: the fused kernel eager runs (attention.py)
            out = fused_attention(args, kwargs)
            if out is not None:
                return out
        return super().call_function(target, args, kwargs)

    def _run_branch(self, branch: fx.GraphModule, operands: Sequence[Any]) -> Any:
        return _FakeInterpreter(branch, self.rec, self.mode).run(*operands)


# ---- outputs -------------------------------------------------------------------------------------

def _classify(rec: TracingMode, flat: list[Any], primals: list[Any]) -> tuple[list[OutputInfo], list[Any]]:
    infos: list[OutputInfo] = []
    graph_outs: list[Any] = []
    seen: dict[int, int] = {}  # id(tensor) -> user output index
    graph_roots: dict[int, int] = {}  # id(root tensor) -> user output index of a graph output
    for i, o in enumerate(flat):
        if not isinstance(o, torch.Tensor):
            infos.append(_scalar_output(o))
            continue
        a = rec.alias_of(o)
        def view(kind: OutputKind, index: int, o: torch.Tensor = o) -> OutputInfo:
            return OutputInfo(kind, index, tuple(_size(s) for s in o.shape), tuple(_size(s) for s in o.stride()),
                              _size(o.storage_offset()), o.requires_grad)
        if id(o) in seen:
            infos.append(OutputInfo(OutputKind.SAME, seen[id(o)]))
        elif (a.chain or a.root.input_index is not None) and (
                o.dtype != a.root.tensor.dtype or (o.is_conj(), o.is_neg()) != (a.root.tensor.is_conj(),
                                                                                 a.root.tensor.is_neg())):
            # rebuilt with as_strided on its base, a view of another dtype (or a conjugate or negative view)
            # would be read as the base's values
            raise AutogradTraceError(f"output {i} is a {o.dtype} view of a {a.root.tensor.dtype} tensor "
                                     "(view_as_real, view(dtype), conj()): outputs that are views of another "
                                     "dtype or conjugate/negative views are not rebuilt")
        elif a.root.input_index is not None:
            idx = a.root.input_index
            if not a.chain and primals[idx] is o:
                infos.append(OutputInfo(OutputKind.INPUT, idx, requires_grad=o.requires_grad))
            else:
                infos.append(view(OutputKind.ALIAS_INPUT, idx))
        elif a.chain and id(a.root.tensor) in graph_roots:
            infos.append(view(OutputKind.ALIAS_OUTPUT, graph_roots[id(a.root.tensor)]))
        else:
            infos.append(OutputInfo(OutputKind.GRAPH, len(graph_outs), requires_grad=o.requires_grad))
            graph_outs.append(o)
            if not a.chain:
                graph_roots[id(o)] = i
        seen.setdefault(id(o), i)
    return infos, graph_outs


_PY_TYPE = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}


def _scalar_output(o: Any) -> OutputInfo:
    """A non-tensor output: a constant, or a symbolic number (``float(t.sum()) + t.mean().item()`` after
    its breaks: the sum of two float arguments), computed again from each call's arguments."""
    if type(o) not in _PY_TYPE:
        return OutputInfo(OutputKind.CONSTANT, value=o)
    py = _PY_TYPE[type(o)]
    expr = o.node.expr
    if expr.is_number or py == "bool" and expr in (True, False):
        return OutputInfo(OutputKind.CONSTANT, value={"int": int, "float": float, "bool": bool}[py](o))
    return OutputInfo(OutputKind.SYMBOLIC, value=f"{py}({py_expr(expr)})")


def _size(s: Any) -> int | str:
    """A view's size/stride/offset for the signature: an int, or a symbolic one as a Python expression
    (read back at run time from the inputs, so returning a view does not fix the sizes)."""
    if isinstance(s, torch.SymInt):
        return int(s.node.expr) if s.node.expr.is_number else py_expr(s.node.expr)
    return int(s)


def _symbol_bindings(primals: Sequence[Any]) -> tuple[tuple[str, int, int], ...]:
    """Where each size symbol of the inputs is read at run time (first input having it)."""
    out: dict[str, tuple[str, int, int]] = {}
    for i, p in enumerate(primals):
        if isinstance(p, torch.Tensor):
            for d, s in enumerate(p.shape):
                if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                    out.setdefault(str(s.node.expr), (str(s.node.expr), i, d))
        elif isinstance(p, (torch.SymInt, torch.SymFloat)) and p.node.expr.is_Symbol:
            out.setdefault(str(p.node.expr), (str(p.node.expr), i, -1))
    return tuple(out.values())


def _mutated_inputs(rec: TracingMode, primals: list[Any], names: Sequence[str], differentiable: bool) -> list[int]:
    """The inputs the graph writes. A leaf that requires grad can only have been written under no_grad (the
    fake trace refuses it otherwise, as eager does): an optimizer's update of its parameters. That is
    written back (under no_grad) when no gradient is traced through the graph; a graph that also has a
    backward is refused (eager would see the write in the saved tensors' versions)."""
    out = []
    for r in rec.roots:
        if r.input_index is not None and r.mutated:
            if primals[r.input_index].requires_grad and differentiable:
                raise AutogradTraceError(
                    f"input {names[r.input_index]!r} requires grad and is mutated in place inside the "
                    "graph; kiln.autograd does not support that yet (mutate it outside the compiled "
                    "region or under torch.no_grad on a tensor that does not require grad)")
            out.append(r.input_index)
    return sorted(out)


# ---- tracing -------------------------------------------------------------------------------------


def _input_names(gm: fx.GraphModule, n_lifted: int, state: Sequence[str]) -> list[str]:
    ph = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    return list(state) + ph


def _trace(gm: fx.GraphModule, example_inputs: Sequence[Any], decompositions: Decompositions | None,
           joint: bool) -> JointGraph:
    state_names = module_state_names(gm)
    state = [gm.get_parameter(n) if n in dict(gm.named_parameters()) else gm.get_buffer(n)
             for n in state_names]
    names = _input_names(gm, len(state), state_names)
    shape_env, inputs = _traced_inputs(gm, example_inputs)
    all_inputs = [*state, *inputs]
    if len(names) != len(all_inputs):
        raise AutogradTraceError(f"the graph has {len(names) - len(state)} placeholders but "
                                 f"{len(example_inputs)} example inputs were given")
    # one ShapeEnv for the whole trace: the capture's, when its graph has symbolic sizes (guards the
    # trace adds land there, and kiln.capture guards on them); real tensors become static fakes
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env, static_shapes=True)
    rec = TracingMode(mode, decompositions)  # kiln.decomp's recorder, functionalizing (tracer.py)
    primals = [fake_input(mode, x, f"input {n!r}") for x, n in zip(all_inputs, names)]
    for i, (p, _n) in enumerate(zip(primals, names)):
        rec.placeholder(f"primals_{i + 1}", p, i)
    interp = _FakeInterpreter(gm, rec, mode)
    grad_ctx = torch.enable_grad() if joint else torch.no_grad()
    # cudnn off while tracing: cudnn_batch_norm writes running stats without saying so in its schema;
    # the native kernels it falls back to have functional forms. Convolutions still pick cudnn at run time.
    with mode, grad_ctx, torch.backends.cudnn.flags(enabled=False), \
            swapped_state(gm, dict(zip(state_names, primals))), symbolic_dispatch(shape_env is not None):
        with rec:
            result = interp.run(*primals[len(state):])
        flat, spec = tree_flatten(result)
        infos, graph_outs = _classify(rec, flat, primals)
        diff = tuple(bool(joint and o.requires_grad and o.grad_fn is not None) for o in graph_outs)
        grad_inputs = tuple(i for i, p in enumerate(primals)
                            if joint and isinstance(p, torch.Tensor) and p.requires_grad)
        grads: Sequence[Any] = ()
        if joint and any(diff) and grad_inputs:
            grads = _trace_backward(rec, graph_outs, diff, [primals[i] for i in grad_inputs])
        elif not (joint and any(diff)):
            diff, grad_inputs = tuple(False for _ in graph_outs), ()
        # else: outputs differentiable only through leaves the graph made (a module built inside
        # compiled code): a forward graph whose ``diff`` outputs require grad (compiled_call.py)
        mutated = _mutated_inputs(rec, primals, names, differentiable=bool(grads) or any(diff))
        with torch.no_grad():
            outs: list[fx.Node | None] = [rec.node_of(o) for o in graph_outs]
            outs += [rec.aliases[id(primals[i])].root.node for i in mutated]
            outs += [rec.node_of(g) if g is not None else None for g in grads]
    sig = GraphSignature(
        n_inputs=len(primals), input_names=tuple(names),
        input_requires_grad=tuple(isinstance(p, torch.Tensor) and p.requires_grad for p in primals),
        outputs=tuple(infos), out_spec=spec, n_graph_outputs=len(graph_outs),
        graph_output_differentiable=diff, mutated_inputs=tuple(mutated), grad_inputs=grad_inputs,
        n_lifted=len(state), symbols=_symbol_bindings(primals))
    return JointGraph(rec.finish(outs), sig, joint=bool(grad_inputs))


def _trace_backward(rec: TracingMode, graph_outs: list[Any],
                    diff: Sequence[bool], inputs: list[Any]) -> Sequence[Any]:
    outs = [o for o, d in zip(graph_outs, diff) if d]
    first = next(n for n in rec.graph.nodes if n.op != "placeholder")
    tangents = []
    for i, o in enumerate(outs):
        t = torch.empty(tuple(o.shape), dtype=o.dtype, device=o.device)
        with rec.graph.inserting_before(first):
            rec.placeholder(f"tangents_{i + 1}", t, None)
        tangents.append(t)
    with rec, autocast_off():
        return torch.autograd.grad(outs, inputs, tangents, allow_unused=True)


def trace_joint(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                decompositions: Decompositions | None = None) -> JointGraph:
    """Trace ``gm`` (torch dialect) into one functional forward+backward ATen graph.

    Gradients are taken for every input that requires grad. When no output needs a gradient the
    result is a forward-only graph (``joint=False``).
    """
    return _traced(gm, example_inputs, decompositions, joint=True)


def trace_inference(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                    decompositions: Decompositions | None = None) -> JointGraph:
    """Trace ``gm`` under no_grad into one functional forward-only ATen graph."""
    return _traced(gm, example_inputs, decompositions, joint=False)


def _traced(gm: fx.GraphModule, example_inputs: Sequence[Any], decompositions: Decompositions | None,
            joint: bool) -> JointGraph:
    try:
        traced = _trace(gm, example_inputs, decompositions, joint)
    except SymbolicSizeError as e:
        raise AutogradTraceError(f"symbolic sizes: {e}") from e
    if not traced.joint:  # no partition follows: its decomposition is finished now
        traced = replace(traced, gm=finish_decomposition(traced.gm, decompositions))
    return traced


def finish_decomposition(gm: fx.GraphModule, decompositions: Decompositions | None) -> fx.GraphModule:
    """``gm`` with ``decompositions`` applied to the ops the trace recorded itself, declared done.

    The trace applies the table to every op that reaches it, but the functional forms it records for
    mutations (training BatchNorm's ``_native_batch_norm_legit_functional``) are kept whole until the
    joint graph is partitioned (recompute.py and the min-cut read them as one op). This finishes the
    job -- on the partitioned halves, or an inference graph -- with kiln.decomp (a copy, no re-trace,
    when nothing is left), and a named table says so in ``GraphAnnotations.decomposed_by``: the
    compiler that receives the graph does not run the table again (decomposition in one place)."""
    name = getattr(decompositions, "name", "")
    if not name or decompositions is None:
        return gm
    out = decompose(gm, decompositions, check=False)
    out.meta.update({k: v for k, v in gm.meta.items() if k not in out.meta})
    annotate(out, replace(annotations_of(gm), decomposed_by=name))
    return out
