"""Python values from graph outputs: what a compiled entry hands back to Python.

At the end of a trace (a return or a graph break) the live values hold fake tensors. ``flatten``
turns each into a *plan* — a small closure — and collects the fakes as graph outputs; on every call
the plan rebuilds the real value from the graph's outputs and the frame's ``L``/``G``.
"""

from __future__ import annotations

import collections
import copy
import types
from collections.abc import Callable
from typing import Any

import torch

from .errors import GraphBreak, SkipFrame
from .foreign import is_immutable_constant, state_in_c
from .generators import LazyIterator, TracedGenerator
from .module_init import BuiltModuleEscapes
from .numpy_table import BoundArrayMethod
from .tracer import SYM_TYPES, Tracer
from .values import (
    NULL,
    AutocastContext,
    Cell,
    ContextExit,
    GradModeContext,
    ListIterator,
    NullContext,
    NumpyArray,
    ResumeIterator,
    SuperProxy,
    TensorMethod,
    TracedFunction,
)

Plan = Callable[[Any, dict, dict], Any]



def _cell(real: types.CellType | None, plan: Plan | None, outs: Any, L: dict, G: dict) -> types.CellType:
    """A rebuilt closure's cell: the real one the function had, or a new one holding ``plan``'s value."""
    if real is not None:
        return real
    assert plan is not None  # (a plan is made for every cell that has no real one)
    return types.CellType(plan(outs, L, G))

class Flattener:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.outputs: list[Any] = []  # fakes / symbolic sizes, in graph-output order
        self.index: dict[int, int] = {}
        self.shared: dict[int, Plan] = {}  # id -> plan of a mutable value (one instance per call)

    def output_index(self, v: Any) -> int:
        k = id(v)
        if k not in self.index:
            self.index[k] = len(self.outputs)
            self.outputs.append(v)
        return self.index[k]

    def plan(self, v: Any, depth: int = 0) -> Plan:
        """The plan for ``v``; a mutable value reached twice (a list in a local and in a closure)
        is rebuilt once per call, so the values stay aliased as in the frame."""
        key = id(v)
        if key in self.shared:
            return self.shared[key]
        p = self._plan(v, depth)
        if isinstance(v, (list, dict, set)) or (hasattr(v, "__dict__") and not isinstance(
                v, (type, types.ModuleType, types.FunctionType, torch.nn.Module, torch.Tensor))):
            p = self.shared[key] = _once_per_call(p, len(self.shared))
        return p

    def _plan(self, v: Any, depth: int = 0) -> Plan:
        if depth > 50:
            raise GraphBreak("value nesting too deep to rebuild after the graph")
        if isinstance(v, torch.Tensor) and id(v) in self.tracer.input_source_of_fake and \
                self.tracer.node_of.get(id(v)) is not None and self.tracer.node_of[id(v)].op == "placeholder":
            return eval(f"lambda outs, L, G: {self.tracer.input_source_of_fake[id(v)]}")  # noqa: S307
        built = self.tracer.built_state.get(id(v)) if isinstance(v, torch.Tensor) else None
        if built is not None:  # a module whose init is graph work outlives the graph (module_init.py)
            raise BuiltModuleEscapes(*built)
        if isinstance(v, (torch.Tensor, *SYM_TYPES)):
            i = self.output_index(v)
            return lambda outs, L, G: outs[i]
        if isinstance(v, NumpyArray):
            return self._numpy_plan(v)
        if isinstance(v, BoundArrayMethod):  # ``arr.sum`` met at a break before its call
            array_plan, name = self._numpy_plan(v.array), v.name
            return lambda outs, L, G: getattr(array_plan(outs, L, G), name)
        if v is None or type(v) in (int, float, bool, str, bytes, complex) or \
                isinstance(v, (torch.dtype, torch.device, types.ModuleType)):
            return lambda outs, L, G: v
        src = self.tracer.source_of.get(id(v))
        if src is not None:
            getter = eval(f"lambda outs, L, G: {src}")  # noqa: S307 (a guard source we generated)
            return getter
        t = type(v)
        if t is list:
            parts = [self.plan(x, depth + 1) for x in v]
            return lambda outs, L, G: [p(outs, L, G) for p in parts]
        if t is tuple:
            parts = [self.plan(x, depth + 1) for x in v]
            if all(_is_const_plan(x) for x in v):
                return lambda outs, L, G: v
            return lambda outs, L, G: tuple(p(outs, L, G) for p in parts)
        if isinstance(v, tuple) and hasattr(t, "_fields"):
            parts = [self.plan(x, depth + 1) for x in v]
            return lambda outs, L, G: t(*(p(outs, L, G) for p in parts))
        if isinstance(v, tuple):  # torch.return_types and other structseqs
            parts = [self.plan(x, depth + 1) for x in v]
            return lambda outs, L, G: t(tuple(p(outs, L, G) for p in parts))
        if t is slice:  # ``x[:n]`` stopped at a break: a symbolic bound is read per call, never baked in
            parts = [self.plan(x, depth + 1) for x in (v.start, v.stop, v.step)]
            return lambda outs, L, G: slice(*(p(outs, L, G) for p in parts))
        if isinstance(v, (set, frozenset)):
            parts = [self.plan(x, depth + 1) for x in v]
            return lambda outs, L, G: t(p(outs, L, G) for p in parts)
        if isinstance(v, TracedGenerator):
            return self._generator_plan(v, depth)
        if isinstance(v, LazyIterator):
            found = v.escapes()
            if found is not None:
                raise found
            raise GraphBreak("a lazy zip/enumerate/map of the trace cannot be rebuilt after the graph")
        if isinstance(v, ListIterator):
            parts = [self.plan(x, depth + 1) for x in v.remaining()]
            return lambda outs, L, G: ResumeIterator([p(outs, L, G) for p in parts])
        if isinstance(v, dict):
            return self._dict_plan(v, depth)
        if isinstance(v, TensorMethod):
            tplan, name = self.plan(v.tensor, depth + 1), v.name
            return lambda outs, L, G: getattr(tplan(outs, L, G), name)
        if isinstance(v, ContextExit):
            return self._context_plan(v)
        if isinstance(v, TracedFunction):
            return self._function_plan(v, depth)
        if isinstance(v, Cell):
            return self.plan(v.value, depth + 1)
        if isinstance(v, SuperProxy):
            cls_plan, obj_plan = self.plan(v.cls, depth + 1), self.plan(v.obj, depth + 1)
            return lambda outs, L, G: super(cls_plan(outs, L, G), obj_plan(outs, L, G))
        if isinstance(v, GradModeContext | NullContext):
            return lambda outs, L, G: v.make_real()
        if v is NULL:
            raise GraphBreak("NULL cannot be rebuilt as a value")
        if hasattr(v, "__dict__") and not isinstance(v, (type, types.FunctionType, torch.nn.Module)) \
                and _traced_inside(v.__dict__):
            return self._object_plan(v, depth)
        if isinstance(v, types.MethodType):
            self_plan = self.plan(v.__self__, depth + 1)
            fn = v.__func__
            return lambda outs, L, G: types.MethodType(fn, self_plan(outs, L, G))
        return self._opaque_plan(v, depth)

    def _opaque_plan(self, v: Any, depth: int) -> Plan:
        """A value with no source and no traced contents. Note: a bound builtin method is rebuilt
        from its owner (``arr.copy`` bound to the first call's array returned that array forever);
        an object the trace constructed is copied per call; a mutable C object a call made during
        the trace (a deque, an ndarray) cannot be rebuilt, so the frame runs in Python; anything else
        (library objects reached through modules) is assumed stable, as in PyTorch's compiler."""
        if is_immutable_constant(v):
            return lambda outs, L, G: v
        owner = getattr(v, "__self__", None)
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)) and owner is not None \
                and not isinstance(owner, (types.ModuleType, type)):
            self_plan, name = self.plan(owner, depth + 1), v.__name__
            return lambda outs, L, G: getattr(self_plan(outs, L, G), name)
        if id(v) in self.tracer.made:
            if hasattr(v, "__dict__") and not state_in_c(v):
                return self._object_plan(v, depth)
            raise SkipFrame(f"a {type(v).__name__} made at capture time is live after the graph and kiln "
                            "cannot rebuild it per call (its state would be shared across calls)")
        return lambda outs, L, G: v

    def _generator_plan(self, v: TracedGenerator, depth: int) -> Plan:
        """A generator of the trace live after the graph: one that has not started is made again by
        calling its function (its body has not run); a started one is made in Python (generators.py)."""
        if v.started or v.callee is None:
            raise v.escapes()
        fn_plan = self.plan(v.callee, depth + 1)
        arg_plans = [self.plan(a, depth + 1) for a in v.args]
        kw_plans = {k: self.plan(a, depth + 1) for k, a in v.kwargs.items()}
        return lambda outs, L, G: fn_plan(outs, L, G)(*(p(outs, L, G) for p in arg_plans),
                                                     **{k: p(outs, L, G) for k, p in kw_plans.items()})

    def _numpy_plan(self, v: NumpyArray) -> Plan:
        """An array of the trace as an ndarray: the caller's own object when it is an input returned
        unchanged, else the graph output's memory as numpy (a scalar result as a NumPy scalar)."""
        node = self.tracer.node_of.get(id(v.t))
        moved = self.tracer.device_copies.get(id(v.t))
        if v.source is not None and (node is not None and node.op == "placeholder" or moved is not None):
            return eval(f"lambda outs, L, G: {v.source}")  # noqa: S307 (a guard source we generated)
        if moved is not None:  # ``x.numpy()`` moved to a device: the tensor's own memory, as eager
            cpu_plan = self._plan(moved[0])
            return lambda outs, L, G: cpu_plan(outs, L, G).numpy()
        self._refuse_device_view(v)
        tensor_plan = self._plan(v.t)
        # force=True: to the CPU (a torch.device context's device), conjugate views resolved (ihfft)
        if v.python is not None:  # a Python number drawn by numpy random (numpy_random.py)
            return lambda outs, L, G: tensor_plan(outs, L, G).item()
        if v.scalar:
            return lambda outs, L, G: tensor_plan(outs, L, G).numpy(force=True)[()]
        return lambda outs, L, G: tensor_plan(outs, L, G).numpy(force=True)

    def _refuse_device_view(self, v: NumpyArray) -> None:
        """A view of a CPU array moved to a device cannot leave the graph as that array's view."""
        if v.t.device.type == "cpu" or not self.tracer.device_copies:
            return
        storage = v.t.untyped_storage()._cdata
        if any(dev.untyped_storage()._cdata == storage for _, dev, _, _ in self.tracer.device_copies.values()):
            raise SkipFrame(f"a view of a numpy array moved to {v.t.device} by a torch.device context lives "
                            "after the graph (as a copy it would no longer alias the array)")

    def _dict_plan(self, v: dict, depth: int) -> Plan:
        t = type(v)
        keys = list(v.keys())
        parts = [self.plan(v[k], depth + 1) for k in keys]
        attrs = {k: self.plan(x, depth + 1) for k, x in getattr(v, "__dict__", {}).items()}
        if t is dict:
            return lambda outs, L, G: {k: p(outs, L, G) for k, p in zip(keys, parts)}

        base_set = collections.OrderedDict.__setitem__ if isinstance(v, collections.OrderedDict) \
            else dict.__setitem__

        def make(outs: Any, L: dict, G: dict) -> Any:
            new = t.__new__(t)
            for k, p in zip(keys, parts):
                base_set(new, k, p(outs, L, G))
            for a, p in attrs.items():
                object.__setattr__(new, a, p(outs, L, G))
            return new
        return make

    def _object_plan(self, v: Any, depth: int) -> Plan:
        attrs = {k: self.plan(x, depth + 1) for k, x in v.__dict__.items()}

        def make(outs: Any, L: dict, G: dict) -> Any:
            new = copy.copy(v)
            for a, p in attrs.items():
                new.__dict__[a] = p(outs, L, G)
            return new
        return make

    def _context_plan(self, v: ContextExit) -> Plan:
        ctx = v.ctx
        if isinstance(ctx, AutocastContext):
            def enter_autocast(outs: Any, L: dict, G: dict) -> Any:
                # the graph closed the block at the break; Python re-enters it for the breaking
                # instruction and the resume function, which breaks again where the block ends
                real = torch.autocast(ctx.device_type, dtype=ctx.dtype, enabled=ctx.enabled,
                                      cache_enabled=ctx.cache_enabled)
                real.__enter__()
                return real.__exit__
            return enter_autocast
        if not isinstance(ctx, (GradModeContext, NullContext)):
            ctx_plan = self.plan(ctx)

            def enter_user(outs: Any, L: dict, G: dict) -> Any:
                real = ctx_plan(outs, L, G)
                return real.__exit__  # already entered by the traced code: its state lives in the object
            return enter_user

        def enter(outs: Any, L: dict, G: dict) -> Any:
            if isinstance(ctx, GradModeContext):
                real = torch.set_grad_enabled.__new__(torch.set_grad_enabled)
                real.prev = bool(ctx.prev)
                real.mode = ctx.enabled
                torch._C._set_grad_enabled(ctx.enabled)
                return real.__exit__
            real = ctx.real
            real.__enter__()
            return real.__exit__
        return enter

    def _function_plan(self, v: TracedFunction, depth: int) -> Plan:
        cell_plans = [self.plan(c.value, depth + 1) if c.real is None else None for c in v.closure]
        defaults = [self.plan(d, depth + 1) for d in v.defaults]

        def make(outs: Any, L: dict, G: dict) -> Any:
            cells = tuple(_cell(c.real, p, outs, L, G) for c, p in zip(v.closure, cell_plans))
            fn = types.FunctionType(v.code, v.globals, v.name,
                                    tuple(p(outs, L, G) for p in defaults) or None, cells or None)
            fn.__kwdefaults__ = dict(v.kwdefaults) or None
            fn.__qualname__ = v.qualname or v.name
            return fn
        return make


_MEMO = "__kiln_rebuilt__"  # key in the call's fresh argument dict L: objects rebuilt this call


def _once_per_call(plan: Plan, key: int) -> Plan:
    def shared(outs: Any, L: dict, G: dict) -> Any:
        memo = L.get(_MEMO)
        if memo is None:
            memo = L[_MEMO] = {}
        if key not in memo:
            memo[key] = plan(outs, L, G)
        return memo[key]
    return shared


def _is_const_plan(x: Any) -> bool:
    return x is None or type(x) in (int, float, bool, str)


def _traced_inside(d: dict, depth: int = 0) -> bool:
    """Whether a traced value (tensor, symbolic number) sits in ``d``'s values, looking through lists,
    tuples, dicts and plain objects' attributes (3 levels). A list of objects counts: HF's
    ``DynamicCache`` keeps its tensors in a list of ``DynamicLayer`` objects, and a cache created
    during the trace reached the code after a graph break with the trace's fake tensors inside."""
    return any(_holds_traced(x, depth) for x in d.values())


def _holds_traced(x: Any, depth: int) -> bool:
    if isinstance(x, (torch.Tensor, *SYM_TYPES)):
        return True
    if depth >= 3:
        return False
    if isinstance(x, (list, tuple)):
        return any(_holds_traced(y, depth + 1) for y in x)
    if isinstance(x, dict):
        return _traced_inside(x, depth + 1)
    if hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType, torch.nn.Module, types.FunctionType)):
        return _traced_inside(x.__dict__, depth + 1)
    return False
