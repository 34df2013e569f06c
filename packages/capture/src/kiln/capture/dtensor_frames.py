"""Forwards of ``torch.nn`` leaf modules whose tensors are DTensors (tensor parallelism), compiled as
local programs: the local-tensor ops DTensor itself runs, forward and backward, with its collectives
(``_c10d_functional.*`` and ``wait_tensor``) as graph nodes in the order DTensor issued them.

Note (how, and why it is sound): on the first call with a set of DTensor specs, the frame runs once
through DTensor with every local tensor wrapped in a recording subclass (``_Rec``) — forward, then a
backward (``torch.autograd.grad``) from tangents placed as torch places them (Partial -> Replicate):
every op DTensor runs on a local tensor is executed (the call's results are real) and recorded into
one FX graph. The graph splits into a forward (local inputs -> local outputs + saved values) and a
backward (saved values + local tangents -> local gradients), each compiled by the context's backend
as an inference graph, and run at DTensor level by kiln.graph's compiled-training ``autograd.Function``
(the one kiln.autograd and loaded programs use), whose forward and backward here unwrap the local
tensors and rewrap the local results with the specs seen while recording. DTensor's dispatch depends only on specs, never on
values, so the program is reused for calls whose key matches: the module (by identity) and its
non-tensor attributes, every argument (DTensor spec, local metadata; plain values by value), grad and
autocast state. A frame this cannot model runs eagerly, logged: a module outside ``torch.nn``
(its forward may read Python state no key holds), an op that mutates, draws random numbers or has a
data-dependent output size, a non-constant argument.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Partial, Replicate
from torch.utils import _pytree as pytree

from kiln.graph import CallSignature, training_function

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device)


_WAIT = torch.ops._c10d_functional.wait_tensor.default
_NOT_ISSUING = (_WAIT, torch.ops._c10d_functional._wrap_tensor_autograd.default)


class NotRecordable(Exception):
    """The frame does something a recorded local program cannot replay."""


# ---- the key -------------------------------------------------------------------------------------

def leaf_module(self_obj: Any) -> bool:
    """Only forwards of torch.nn's own modules: their behaviour is a function of their tensors and
    their plain attributes (both in the key)."""
    return isinstance(self_obj, nn.Module) and type(self_obj).__module__.startswith("torch.nn.modules.")


def only_dtensors(L: dict, module: Any) -> bool:
    """Every tensor-subclass input of the frame (arguments, the module's parameters) is a DTensor."""
    values = [*L.values(), *(module._parameters.values() if isinstance(module, nn.Module) else ())]
    return all(isinstance(v, DTensor) or type(v) in (torch.Tensor, nn.Parameter, nn.parameter.Buffer)
               for v in values if isinstance(v, torch.Tensor))


def _tensor_key(t: torch.Tensor) -> tuple:
    local = t._local_tensor if isinstance(t, DTensor) else t
    meta = (tuple(local.shape), local.stride(), local.storage_offset(), local.dtype, local.device,
            t.requires_grad, type(t).__name__)
    if isinstance(t, DTensor):
        spec = t._spec
        return (*meta, id(spec.mesh), spec.placements, tuple(t.shape), t.stride())
    return meta


def frame_key(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """Everything the recorded program assumed; raises NotRecordable for a value it cannot hold."""
    parts: list[object] = [id(module), torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                           torch.is_autocast_enabled("cuda")]
    for name, v in sorted(vars(module).items()):
        if (name.startswith("_") and name != "_parameters") or name == "forward":
            continue  # (an instance ``forward`` is kiln's routing of the call, not read by the forward)
        if name == "_parameters":
            parts += [(n, None if p is None else _tensor_key(p)) for n, p in v.items()]
        elif isinstance(v, _CONSTANTS) or (isinstance(v, tuple) and all(isinstance(e, _CONSTANTS) for e in v)):
            parts.append((name, v))
        else:
            raise NotRecordable(f"attribute {name!r} of {type(module).__name__} is a {type(v).__name__}")
    parts += [(n, _tensor_key(b)) for n, b in module._buffers.items() if b is not None]
    for v in (*args, *sorted(kwargs.items())):
        value = v[1] if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) else v
        if isinstance(value, torch.Tensor):
            parts.append(_tensor_key(value))
        elif isinstance(value, _CONSTANTS):
            parts.append(("const", value))
        else:
            raise NotRecordable(f"an argument is a {type(value).__name__}")
    parts.append(tuple(kwargs))
    return tuple(parts)


# ---- recording -----------------------------------------------------------------------------------

class _Recorder:
    def __init__(self) -> None:
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.phase = "forward"
        self.constants = 0

    def placeholder(self, name: str, value: torch.Tensor) -> _Rec:
        node = self.graph.placeholder(name)
        node.meta["val"] = value
        node.meta["phase"] = self.phase
        return _Rec(value, node, self)

    def constant(self, t: torch.Tensor) -> fx.Node:
        name = f"_const{self.constants}"
        self.constants += 1
        self.root.register_buffer(name, t.detach().clone())
        node = self.graph.get_attr(name)
        node.meta["phase"] = "constant"
        return node

    def call(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        tags = set(getattr(func, "tags", ()))
        if func._schema.is_mutable or torch.Tag.nondeterministic_seeded in tags \
                or torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags:
            raise NotRecordable(f"DTensor ran {func} (mutating, random or data-dependent)")

        def as_node(x: Any) -> Any:
            if isinstance(x, _Rec):
                return x.node
            if isinstance(x, torch.Tensor):
                return self.constant(x)
            return x
        node = self.graph.call_function(func, *pytree.tree_map(as_node, (args, kwargs)))
        node.meta["phase"] = self.phase
        real_args, real_kwargs = pytree.tree_map(lambda x: x.inner if isinstance(x, _Rec) else x, (args, kwargs))
        out = func(*real_args, **real_kwargs)
        if func.namespace == "_c10d_functional" and func not in _NOT_ISSUING and isinstance(out, torch.Tensor):
            # Note: a collective's result is waited for right where it was issued (a wait_tensor node
            # next to it): DTensor waits lazily through an AsyncCollectiveTensor, which the recording
            # does not always see, and a read before the wait races the communication.
            node.meta["phase"] = self.phase
            node.meta["val"] = out
            node = self.graph.call_function(_WAIT, (node,))
            out = _WAIT(out)
        node.meta["phase"] = self.phase
        return self._wrap(out, node)

    def _wrap(self, out: Any, node: fx.Node) -> Any:
        if isinstance(out, torch.Tensor):
            node.meta["val"] = out
            return _Rec(out, node, self)
        if isinstance(out, (tuple, list)):
            items = []
            for i, o in enumerate(out):
                item = self.graph.call_function(operator.getitem, (node, i))
                item.meta["phase"] = self.phase
                items.append(self._wrap(o, item) if isinstance(o, torch.Tensor) else o)
            return type(out)(items)
        if out is None or isinstance(out, _CONSTANTS):
            return out
        raise NotRecordable(f"an op returned a {type(out).__name__}")


class _Rec(torch.Tensor):
    """A local tensor whose ops are executed and recorded (the inner tensor holds the value)."""

    inner: torch.Tensor  # type: ignore[assignment]
    node: fx.Node
    recorder: _Recorder

    @staticmethod
    def __new__(cls, inner: torch.Tensor, node: fx.Node, recorder: _Recorder) -> _Rec:
        r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=inner.device, requires_grad=False)
        r.inner, r.node, r.recorder = inner, node, recorder
        return r

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:  # type: ignore[override]
        kwargs = kwargs or {}
        recs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, _Rec)]
        return recs[0].recorder.call(func, tuple(args), kwargs)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"_Rec({self.node.name})"


# ---- the program ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalProgram:
    """A DTensor frame as two compiled local programs and the specs to rewrap their results with."""

    forward: Any  # (locals) -> (outputs..., saved...)
    backward: Any  # (saved..., tangents...) -> (gradients of the differentiable inputs...)
    function: type[torch.autograd.Function]  # runs both over DTensors (_local_function)
    input_specs: tuple[DTensorSpec | None, ...]
    output_specs: tuple[DTensorSpec, ...]
    tangent_specs: tuple[DTensorSpec, ...]
    grad_specs: tuple[DTensorSpec, ...]  # per differentiable input
    differentiable: tuple[int, ...]  # indices of inputs that get gradients
    n_outputs: int
    single: bool  # the frame returned one tensor, not a tuple
    op_count: int  # local ops in the forward and backward programs (collectives included)
    collectives: int


def _inputs(module: nn.Module, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """The frame's tensors as (name, value): parameters (``self.p``), buffers (``self.b``), then
    arguments (``arg0``, keyword names)."""
    named: list[tuple[str, torch.Tensor]] = [(f"self.{n}", p) for n, p in module._parameters.items() if p is not None]
    named += [(f"self.{n}", b) for n, b in module._buffers.items() if b is not None]
    named += [(f"arg{i}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    named += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return named


def _wrap_rec(t: torch.Tensor, rec: _Recorder, name: str) -> torch.Tensor:
    if isinstance(t, DTensor):
        local = rec.placeholder(name, t._local_tensor.detach())
        return DTensor(local, t._spec, requires_grad=t.requires_grad)
    return rec.placeholder(name, t.detach()).requires_grad_(False)


def _tangent_spec(spec: DTensorSpec) -> DTensorSpec:
    placements = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)
    return DTensorSpec(spec.mesh, placements, tensor_meta=spec.tensor_meta)


def record(module: nn.Module, forward: Any, args: tuple, kwargs: dict) -> tuple[fx.GraphModule, dict[str, Any]]:
    """Run ``forward`` once through DTensor on recording local tensors (forward and backward)."""
    rec = _Recorder()
    named = _inputs(module, args, kwargs)
    if any(not isinstance(t, DTensor) and t.requires_grad for _, t in named):
        raise NotRecordable("a plain tensor argument requires grad next to DTensors")
    wrapped = {n: _wrap_rec(t, rec, n.replace(".", "_")) for n, t in named}
    saved_params, saved_buffers = dict(module._parameters), dict(module._buffers)
    try:  # the module's own tensors swapped for recording ones while the forward runs
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is not None:
                    table[name] = wrapped[f"self.{name}"]  # type: ignore[assignment]
        call_args = [wrapped.get(f"arg{i}", a) for i, a in enumerate(args)]
        call_kwargs = {k: wrapped.get(k, v) for k, v in kwargs.items()}
        out = forward(*call_args, **call_kwargs)
    finally:
        module._parameters.clear()
        module._parameters.update(saved_params)
        module._buffers.clear()
        module._buffers.update(saved_buffers)
    outs = (out,) if isinstance(out, torch.Tensor) else out
    if not isinstance(outs, tuple) or not all(isinstance(o, DTensor) and isinstance(o._local_tensor, _Rec)
                                              for o in outs):
        raise NotRecordable("the forward did not return DTensors")
    info: dict[str, Any] = {"named": named, "outs": outs, "single": isinstance(out, torch.Tensor)}
    diff = [i for i, (_, t) in enumerate(named) if t.requires_grad]
    rec.phase = "backward"
    tangents, grads = [], []
    if diff and any(o.requires_grad for o in outs):
        for i, o in enumerate(outs):
            spec = _tangent_spec(o._spec)
            inner = o._local_tensor.inner  # (the values do not matter: only the ops are kept)
            local = torch.zeros(inner.shape, dtype=inner.dtype, device=inner.device)
            tangents.append(DTensor(rec.placeholder(f"tangent{i}", local), spec, requires_grad=False))
        grads = list(torch.autograd.grad(outs, [wrapped[named[i][0]] for i in diff], tangents, allow_unused=True))
    info.update(diff=diff, tangents=tangents, grads=grads, recorder=rec)
    return fx.GraphModule(rec.root, rec.graph), info


def _split(gm: fx.GraphModule, info: dict[str, Any]) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    """The recorded graph as a forward (inputs -> outputs + saved) and a backward (saved + tangents ->
    gradients) graph, and how many values the forward saves."""
    nodes = list(gm.graph.nodes)
    backward_nodes = [n for n in nodes if n.meta.get("phase") == "backward"]
    saved = [n for n in nodes if n.meta.get("phase") == "forward"
             and any(u.meta.get("phase") == "backward" for u in n.users)]
    fwd, env = fx.Graph(), dict[fx.Node, fx.Node]()
    for n in nodes:
        if n.meta.get("phase") in ("forward", "constant") and n.op != "output":
            env[n] = fwd.node_copy(n, lambda a: env[a])
    out_nodes = [o._local_tensor.node for o in info["outs"]]
    fwd.output(tuple(env[n] for n in (*out_nodes, *saved)))
    bwd, benv = fx.Graph(), dict[fx.Node, fx.Node]()
    for i, n in enumerate(saved):
        benv[n] = bwd.placeholder(f"saved{i}")
        benv[n].meta["val"] = n.meta.get("val")
    for n in nodes:
        if n.meta.get("phase") == "constant":
            benv[n] = bwd.node_copy(n, lambda a: benv[a])
        elif n in backward_nodes:
            benv[n] = bwd.node_copy(n, lambda a: benv[a])
    grad_nodes = []
    for g in info["grads"]:
        if g is None:
            continue
        if not isinstance(g, DTensor) or not isinstance(g._local_tensor, _Rec):
            raise NotRecordable("a gradient is not a DTensor computed from the recorded values")
        grad_nodes.append(benv[g._local_tensor.node])
    bwd.output(tuple(grad_nodes))
    forward, backward = fx.GraphModule(gm, fwd), fx.GraphModule(gm, bwd)
    for g in (forward, backward):
        g.graph.eliminate_dead_code()
        g.recompile()
    return forward, backward, len(saved)


def _is_collective(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "_c10d_functional"


def _compiled(gm: fx.GraphModule, backend: Any) -> Any:
    """The backend's compiled graph, collectives included (kiln.inductor runs them from its wrapper in
    program order, each operand and output kept until its ``wait_tensor``)."""
    return backend(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"])


def build_program(module: nn.Module, forward: Any, args: tuple, kwargs: dict, backend: Any) -> LocalProgram:
    """Record the frame (module_forward(*args, **kwargs)) and compile its local programs."""
    with torch.enable_grad():
        gm, info = record(module, forward, args, kwargs)
    fwd_gm, bwd_gm, _ = _split(gm, info)
    ops = [n for g in (fwd_gm, bwd_gm) for n in g.graph.nodes if n.op == "call_function"
           and isinstance(n.target, torch._ops.OpOverload)]
    with torch.no_grad():
        fwd = _compiled(fwd_gm, backend)
        bwd = _compiled(bwd_gm, backend) if info["grads"] else None
    named = info["named"]
    grads = [g for g in info["grads"]]
    diff = tuple(i for i, g in zip(info["diff"], grads) if g is not None)
    output_specs = tuple(o._spec for o in info["outs"])
    tangent_specs = tuple(t._spec for t in info["tangents"])
    grad_specs = tuple(g._spec for g in grads if g is not None)
    return LocalProgram(
        forward=fwd, backward=bwd,
        function=_local_function(fwd, bwd, len(named), output_specs, tangent_specs, grad_specs, diff),
        input_specs=tuple(t._spec if isinstance(t, DTensor) else None for _, t in named),
        output_specs=output_specs, tangent_specs=tangent_specs, grad_specs=grad_specs,
        differentiable=diff, n_outputs=len(info["outs"]), single=info["single"],
        op_count=len(ops), collectives=sum(_is_collective(n) for n in ops))


def _locals(values: Any) -> list[torch.Tensor]:
    return [v._local_tensor if isinstance(v, DTensor) else v for v in values]


_NO_TREE = pytree.tree_flatten(())[1]  # (the Function never rebuilds outputs: run_program does)


def _local_function(forward: Any, backward: Any, n_inputs: int, output_specs: tuple[DTensorSpec, ...],
                    tangent_specs: tuple[DTensorSpec, ...], grad_specs: tuple[DTensorSpec, ...],
                    differentiable: tuple[int, ...]) -> type[torch.autograd.Function]:
    """kiln.graph's compiled-training Function over DTensors: its forward runs the local forward on
    the inputs' local tensors and wraps the outputs as DTensors; its backward places each tangent as
    recorded and runs the local backward on their local tensors, wrapping the gradients."""
    n_outputs = len(output_specs)

    def fw(args: list[Any]) -> list[Any]:
        res = list(forward(*_locals(args)))
        outs = [DTensor(o, spec, requires_grad=False) for o, spec in zip(res[:n_outputs], output_specs)]
        return [*outs, *res[n_outputs:]]

    def bw(args: list[Any]) -> list[Any]:
        n_saved = len(args) - len(tangent_specs)
        tangents = [_local_tangent(g, spec) for g, spec in zip(args[n_saved:], tangent_specs)]
        local_grads = list(backward(*args[:n_saved], *tangents))
        return [DTensor(g, spec, requires_grad=False) for g, spec in zip(local_grads, grad_specs)]

    sig = CallSignature(n_inputs, n_outputs, (), (True,) * n_outputs, differentiable, (), _NO_TREE)
    return training_function(sig, fw, bw)


def _local_tangent(g: torch.Tensor, spec: DTensorSpec) -> torch.Tensor:
    """The local tangent of an output recorded with ``spec``: the incoming gradient placed as recorded;
    zeros for an output nobody differentiated (the Function passes plain zeros for those)."""
    if not isinstance(g, DTensor):
        if g.count_nonzero() != 0:
            raise RuntimeError("kiln: a tensor-parallel layer's output got a gradient that is not a DTensor")
        meta = spec.tensor_meta
        assert meta is not None
        local_shape, _ = _local_shape(spec)
        return torch.zeros(local_shape, dtype=meta.dtype, device=_device(spec))
    if tuple(g.placements) != tuple(spec.placements):
        g = g.redistribute(spec.mesh, spec.placements)
    return g._local_tensor.contiguous()


def _local_shape(spec: DTensorSpec) -> tuple[list[int], list[int]]:
    assert spec.tensor_meta is not None
    shape, offset = compute_local_shape_and_global_offset(spec.tensor_meta.shape, spec.mesh, spec.placements)
    return list(shape), list(offset)


def _device(spec: DTensorSpec) -> torch.device:
    return torch.device(spec.mesh.device_type, torch.cuda.current_device()) \
        if spec.mesh.device_type == "cuda" else torch.device(spec.mesh.device_type)


def run_program(prog: LocalProgram, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    named = _inputs(module, args, kwargs)
    outs = prog.function.apply(*[t for _, t in named])
    return outs[0] if prog.single else outs
