"""torch.nn modules built inside compiled code (``nn.Linear(8, 4)(x)`` in a forward): the module's
initialisation is graph work.

Note: the module is built for real at capture time, on fake tensors, while a dispatch mode records
every ATen op its ``__init__`` runs (``empty``, ``detach`` for each ``nn.Parameter``, then
``kaiming_uniform_``'s ``uniform_``, ``normal_``, ``fill_``, ``zero_``...). Those ops become graph
nodes in the order eager runs them, and a ``requires_grad_()`` node makes each parameter a leaf that
requires grad once it is initialised. So every call of the graph draws fresh weights from torch's
global generator, the same draws in the same order as eager (the capture graph run as is gives
eager's values bit for bit under the same ``torch.manual_seed``; a backend that lowers random ops to
a generator of its own keeps only their distribution), and the Python module object exists only
in the trace, where the forward reads its fake parameters as graph values.

The module object cannot leave the graph that way: returned, stored on an object or a global, or
live at a later graph break, it must be a real ``nn.Module`` with real ``nn.Parameter``s whose
gradients reach the user. Such a module (or any tensor its construction made) reaching the values
rebuilt after the graph raises ``BuiltModuleEscapes``; the capture runs again with a graph break at
that construction, which then runs in Python on every call (``capture.run_capture``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import GraphBreak

if TYPE_CHECKING:
    from .frame import Frame

Site = tuple[Any, int]  # (code object, instruction offset) of a module construction

_BUILD_HINT = "build the module outside the compiled function"


class BuiltModuleEscapes(Exception):
    """Internal: a module whose initialisation is graph work, or a leaf tensor made in the graph
    (``grad_leaf_call``), outlives the graph (see the note). ``what`` names it (``module Linear``)."""

    def __init__(self, site: Site, what: str) -> None:
        super().__init__(f"{what} built inside compiled code outlives the graph")
        self.site = site
        self.what = what


class _InitRecorder(TorchDispatchMode):
    """Records the ATen ops a module's ``__init__`` runs (above the fake mode, which computes them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def site_of(frame: Frame) -> Site:
    assert frame.current is not None
    return (frame.code, frame.current.offset)


def build_module(frame: Frame, cls: type, args: list, kwargs: dict) -> nn.Module:
    """Build ``cls(*args, **kwargs)`` (a torch.nn module) on fake tensors, recording its
    initialisation in the graph; breaks where that cannot be done faithfully."""
    tracer = frame.tracer
    name = cls.__name__
    if site_of(frame) in frame.ctx.escaping_builds:
        raise GraphBreak(
            f"constructing module {name} inside compiled code: the module outlives the graph "
            "(returned, stored, or live at a graph break) and needs real nn.Parameters",
            "it is built in Python on every call; build it outside the compiled function to "
            "keep one graph",
        )
    rec = _InitRecorder()
    try:
        # fork_rng: nothing drawn at capture time touches the real generator (fake tensors draw
        # nothing, but a module may make a real tensor on the side)
        with torch.random.fork_rng(devices=[]), tracer.fake_mode, rec:
            module = cls(*args, **kwargs)
    except GraphBreak:
        raise
    except Exception as e:
        raise GraphBreak(
            f"constructing module {name} inside compiled code failed on fake tensors "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
            _BUILD_HINT,
        ) from e
    if not rec.ops:  # stateless, or a container of modules built in the trace or read from a source
        return module
    if tracer.scopes:
        raise GraphBreak(
            f"constructing module {name} (with parameters or buffers) inside a torch.cond branch",
            _BUILD_HINT,
        )
    _record_init(frame, name, rec.ops)
    for t in (*module.parameters(), *module.buffers()):
        if t is not None and (not isinstance(t, FakeTensor) or tracer.node_of.get(id(t)) is None):
            raise GraphBreak(
                f"constructing module {name} inside compiled code: its state holds a tensor "
                "its initialisation did not make",
                _BUILD_HINT,
            )
    for p in module.parameters():
        if (
            p.requires_grad and id(p) in tracer.built_state
        ):  # a Parameter: a leaf requiring grad once set
            node = tracer.graph.call_method("requires_grad_", (tracer.node_of[id(p)],))
            node.meta["stack_trace"] = tracer.location
            tracer.register(p, node)
    return module


def _record_init(frame: Frame, name: str, ops: list[tuple[Any, tuple, dict, Any]]) -> None:
    """The recorded ops as graph nodes, in eager's order; every tensor they made is marked as state
    built at this site (``Tracer.built_state``), so it cannot leave the graph unnoticed."""
    tracer = frame.tracer
    site = site_of(frame)
    for func, args, kwargs, out in ops:
        tracer.refuse_random_after_seed(func)
        if func is torch.ops.aten.detach.default and tracer.node_of.get(id(args[0])) is not None:
            # ``nn.Parameter(t)`` on a fake detaches it: a tensor with no autograd history and no
            # other user, so the parameter is the same graph value
            tracer.register(out, tracer.node_of[id(args[0])])
            tracer.built_state[id(out)] = (site, f"module {name}")
            continue
        if (
            func in _LIFTS
            and isinstance(args[0], torch.Tensor)
            and not isinstance(args[0], FakeTensor)
        ):
            # ``torch.tensor(0)`` (BatchNorm's num_batches_tracked): the constant made in the graph
            const = args[0]
            if const.numel() > 64:
                raise GraphBreak(
                    f"constructing module {name} inside compiled code: a {const.numel()}-element "
                    "constant in its initialisation",
                    _BUILD_HINT,
                )
            node = tracer.graph.call_function(
                torch.tensor, (const.tolist(),), {"dtype": const.dtype, "device": const.device}
            )
        else:
            node = tracer.graph.create_node(
                "call_function", func, tracer.to_arg(args), tracer.to_arg(kwargs)
            )
        node.meta["stack_trace"] = tracer.location
        tracer.register(out, node)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                tracer.built_state[id(t)] = (site, f"module {name}")


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def make_parameter(frame: Frame, cls: type, args: list, kwargs: dict) -> nn.Parameter:
    """``nn.Parameter(torch.randn(4, 4))`` in a user module's ``__init__`` built in the trace: the
    data's graph value detached, then made a leaf that requires grad, as eager's ``Parameter``. It is
    built state: it cannot leave the graph (a module holding it is built in Python instead)."""
    tracer = frame.tracer
    names = ("data", "requires_grad")
    bound = dict(zip(names, args)) | kwargs
    data, requires_grad = bound.get("data"), bound.get("requires_grad", True)
    if len(args) > 2 or set(bound) - set(names) or not isinstance(requires_grad, bool) or \
            not isinstance(data, FakeTensor) or tracer.node_of.get(id(data)) is None:
        raise GraphBreak(f"{cls.__name__}(...) inside compiled code on a value that is not a tensor of the graph",
                         _BUILD_HINT)
    with tracer.fake_mode:
        param = cls(data, requires_grad)
    node = tracer.graph.call_method("detach", (tracer.node_of[id(data)],))
    if requires_grad:
        node.meta["stack_trace"] = tracer.location
        node = tracer.graph.call_method("requires_grad_", (node,))
    node.meta["stack_trace"] = tracer.location
    tracer.register(param, node)
    tracer.built_state[id(param)] = (site_of(frame), f"{cls.__name__}")
    return param


def mark_built_state(frame: Frame, module: nn.Module, site: Site, before: int) -> None:
    """The state a user module's inlined ``__init__`` made (``built_state`` entries from ``before`` on:
    its torch.nn submodules' and ``nn.Parameter``s) and the graph tensors it holds as parameters or
    buffers: built state of its own construction (``site``), so the module cannot leave the graph
    unnoticed and, if it does, the break is at the user's construction of it."""
    tracer = frame.tracer
    what = (site, f"module {type(module).__name__}")
    for key in list(tracer.built_state)[before:]:
        tracer.built_state[key] = what
    for t in (*module.parameters(), *module.buffers()):
        if isinstance(t, torch.Tensor) and id(t) in tracer.node_of and id(t) not in tracer.input_source_of_fake \
                and id(t) not in tracer.built_state:
            tracer.built_state[id(t)] = what


def grad_leaf_call(frame: Frame, what: str, run: Callable[[], Any]) -> Any:
    """``run()`` (a torch function or tensor method call, ``what``); a tensor it makes that requires
    grad with no history (``torch.ones(3).requires_grad_()``, ``torch.zeros(3, requires_grad=True)``)
    is built state like a module's parameters: inside the graph the gradients that reach it go nowhere
    anyone can see (kiln.autograd's outputs still require grad, as eager's), but once it leaves the
    graph its ``.grad`` is the user's, so there the call runs in Python (the capture is run again with a
    break at it, as for an escaping module)."""
    if frame.ctx.escaping_builds and site_of(frame) in frame.ctx.escaping_builds:
        raise GraphBreak(
            f"{what} inside compiled code makes a tensor that requires grad, and it outlives the graph "
            "(returned, stored, or live at a graph break): its gradient is read outside",
            "it runs in Python on every call; make the tensor outside the compiled function to keep one graph",
        )
    result = run()
    if isinstance(result, torch.Tensor) and result.requires_grad and result.grad_fn is None:
        tracer = frame.tracer
        if id(result) not in tracer.input_source_of_fake and id(result) not in tracer.built_state:
            tracer.built_state[id(result)] = (site_of(frame), f"a tensor requiring grad made by {what}")
    return result
