"""Python semantics over interpreted values: attributes, items, operators, truth, iteration.

Real Python objects are operated on for real; FakeTensors and symbolic sizes are recorded into
the graph through the tracer. Anything that would mutate state the trace does not own (objects read
from the frame's inputs) breaks the graph so it runs in Python.
"""

from __future__ import annotations

import collections
import operator
import sys
import types
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kiln.graph import may_overlap_itself

from .aliasing import byte_span, share_no_element
from .errors import GraphBreak
from .foreign import is_ndarray
from .generators import GENERATOR_METHODS, GeneratorMethod, TracedGenerator
from .numpy_random import is_python_draw, python_operator
from .numpy_table import array_attr, array_getitem, array_setitem
from .numpy_trace import binary, unary
from .shape_rules.pointwise import FAST_POINTWISE
from .shape_rules.views import fast_getitem
from .sources import attr_source, item_source, module_member_source
from .tracer import DELETED, SYM_TYPES
from .values import InterpIterator, ListIterator, NumpyArray, SuperProxy, TensorMethod

if TYPE_CHECKING:
    from .frame import Frame

TENSOR_META_ATTRS = frozenset({
    "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse", "is_leaf",
    "is_quantized", "is_meta", "is_nested", "is_mkldnn", "is_cpu", "is_xpu", "is_mps", "itemsize",
    "_version", "is_inference",
})
TENSOR_VIEW_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})


def is_traced(v: Any) -> bool:
    return isinstance(v, (torch.Tensor, *SYM_TYPES))


def contains_traced(v: Any, depth: int = 0) -> bool:
    if isinstance(v, (torch.Tensor, *SYM_TYPES, NumpyArray)):
        return True
    if depth > 4:
        return False
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(contains_traced(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return any(contains_traced(x, depth + 1) for x in v.values())
    if isinstance(v, slice):
        return any(contains_traced(x, depth + 1) for x in (v.start, v.stop, v.step))
    return False


def lookup_static(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


# ---- attributes ----------------------------------------------------------------------------
def load_attr(frame: Frame, obj: Any, name: str) -> Any:
    tracer = frame.tracer
    if isinstance(obj, torch.Tensor):
        return tensor_attr(frame, obj, name)
    if isinstance(obj, SuperProxy):
        return super_attr(frame, obj, name)
    if isinstance(obj, NumpyArray):
        return array_attr(frame, obj, name)
    if isinstance(obj, TracedGenerator):
        if name in GENERATOR_METHODS:
            return GeneratorMethod(obj, name)
        raise GraphBreak(f"attribute {name!r} of a generator inside compiled code", "the generator runs in Python")
    written = tracer.attr_writes.get((id(obj), name))
    if written is not None:
        if written[2] is DELETED:
            raise AttributeError(name)
        return written[2]
    if isinstance(obj, types.ModuleType):
        value = _read_attr(tracer, obj, name, _module_source(tracer, obj))
        src = module_attr_source(tracer, obj, name, value)
        return value if src is None else tracer.wrap(value, src)
    src = tracer.source_of.get(id(obj))
    if isinstance(obj, nn.Module):
        d = obj.__dict__
        static = lookup_static(type(obj), name)
        if not (isinstance(static, property) or hasattr(static, "__set__")):
            if name in d:
                return tracer.wrap(d[name], attr_source(src, name) if src else None)
            for table in ("_parameters", "_buffers", "_modules"):
                t = d.get(table)
                if t is not None and name in t:
                    return tracer.wrap(t[name], module_member_source(src, table, name) if src else None)
    if src is not None or isinstance(obj, type):
        static = lookup_static(type(obj), name) if not isinstance(obj, type) else None
        if isinstance(static, types.FunctionType) and name not in getattr(obj, "__dict__", {}):
            return types.MethodType(static, obj)
        if isinstance(static, property) and isinstance(static.fget, types.FunctionType) \
                and name not in getattr(obj, "__dict__", {}):
            # traced, not read for real: the getter may have effects (a parametrization's power iteration
            # updates buffers), which a read for the guards and another for the inputs ran twice a call
            return frame.call(static.fget, [obj], {})
        value = _read_attr(tracer, obj, name, src)
        if isinstance(value, (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)) and \
                getattr(value, "__self__", None) is obj:
            return value  # a method bound to a guarded object (``func.__get__`` too): nothing more to guard
        if isinstance(obj, type) and isinstance(value, (types.FunctionType, types.MethodType, type)):
            return value
        return tracer.wrap(value, attr_source(src, name) if src else None)
    static = lookup_static(type(obj), name)
    if isinstance(static, property) and isinstance(static.fget, types.FunctionType) \
            and name not in getattr(obj, "__dict__", {}):
        return frame.call(static.fget, [obj], {})
    value = getattr(obj, name)
    check_tracked(frame, value, f"attribute {name!r}")
    return value


# Libraries whose module attributes are treated as constants (their functions, classes, dtypes);
# attributes of every other module (a config module's ``SCALE``, ``os.environ``) are state the
# program may change between calls: guarded like globals.
_STABLE_MODULES = ("torch", "numpy", "math", "cmath", "operator", "builtins", "functools", "itertools",
                   "typing", "types", "collections", "enum", "abc", "logging", "warnings", "kiln",
                   "sympy", "einops", "dataclasses", "contextlib", "inspect", "re", "copy", "copyreg",
                   "posixpath", "weakref", "threading", "importlib", "packaging", "string", "json")


def module_attr_source(tracer: Any, module: types.ModuleType, name: str, value: Any) -> str | None:
    """The guard source of ``module.name``, or None when the attribute is taken as a constant."""
    root = (module.__name__ or "").partition(".")[0]
    if not isinstance(value, torch.Tensor) and (root in _STABLE_MODULES or isinstance(value, types.ModuleType)):
        return None
    src = _module_source(tracer, module)
    return None if src is None else attr_source(src, name)


def _module_source(tracer: Any, module: types.ModuleType) -> str | None:
    src = tracer.source_of.get(id(module))
    if src is not None:
        return src
    if sys.modules.get(module.__name__) is module:
        return f"__import__('sys').modules[{module.__name__!r}]"
    return None


def _read_attr(tracer: Any, obj: Any, name: str, src: str | None) -> Any:
    """``getattr(obj, name)``; when it raises AttributeError on a guarded object, the absence is
    guarded too: ``getattr(o, 'x', 0)``, ``hasattr`` and ``try: o.x`` branch on it, and an object
    that gains the attribute later must not rerun a trace that took the default."""
    try:
        return getattr(obj, name)
    except AttributeError:
        stable = isinstance(obj, types.ModuleType) and (obj.__name__ or "").partition(".")[0] in _STABLE_MODULES
        if src is not None and not stable:
            tracer.add_guard(f"hasattr({src}, {name!r})", "EQUALS_MATCH", False)
        raise


def super_attr(frame: Frame, sp: SuperProxy, name: str) -> Any:
    mro = type(sp.obj).__mro__ if not isinstance(sp.obj, type) else sp.obj.__mro__
    start = mro.index(sp.cls) + 1
    for klass in mro[start:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, staticmethod):
                return attr.__func__
            if isinstance(attr, classmethod):
                return types.MethodType(attr.__func__, sp.obj if isinstance(sp.obj, type) else type(sp.obj))
            if isinstance(attr, property):
                return frame.call(attr.fget, [sp.obj], {})
            if hasattr(attr, "__get__"):
                return attr.__get__(sp.obj, type(sp.obj))
            return attr
    return getattr(super(sp.cls, sp.obj), name)


def tensor_attr(frame: Frame, t: torch.Tensor, name: str) -> Any:
    tracer = frame.tracer
    if name == "shape":
        shape = t.shape
        if any(isinstance(s, torch.SymInt) for s in shape):
            return tracer.record("call_method", "size", (t,), {}, lambda: t.size(), pure=True)
        return shape
    if name in TENSOR_META_ATTRS:
        return getattr(t, name)
    if name in TENSOR_VIEW_ATTRS:
        return tracer.record("call_function", getattr, (t, name), {}, lambda: getattr(t, name))
    if name == "data":
        return tracer.record("call_method", "detach", (t,), {}, lambda: t.detach())
    if name == "grad":
        grad = input_grad(tracer, t)
        if grad is not NOT_AN_INPUT:
            return grad
    if name in ("grad", "grad_fn", "_base"):
        raise GraphBreak(f"Tensor.{name} is not supported inside a graph")
    static = lookup_static(type(t), name)
    if static is not None and callable(static) or hasattr(torch.Tensor, name) and callable(getattr(torch.Tensor, name)):
        return TensorMethod(t, name)
    if not hasattr(torch.Tensor, name):
        return python_attr(tracer, t, name)
    raise GraphBreak(f"unsupported tensor attribute {name!r}")


def python_attr(tracer: Any, t: torch.Tensor, name: str) -> Any:
    """An attribute a program set on a caller's tensor (``x.gain = 2.0``): read from the real tensor's
    ``__dict__``, whose keys and values are guarded (so its absence too); a tensor made in the graph
    has none (setting one breaks the graph)."""
    source, real = input_value(tracer, t)
    if real is None:
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")
    attrs = tracer.wrap(real.__dict__, attr_source(source, "__dict__"))
    if name not in attrs:
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")
    return tracer.wrap(attrs[name], item_source(attr_source(source, "__dict__"), name))


NOT_AN_INPUT = object()


def input_grad(tracer: Any, t: torch.Tensor) -> Any:
    """``p.grad`` of a graph input (a parameter an optimizer updates): the real tensor's ``.grad`` read
    through its source (``L['p'].grad``), a graph input of its own, or None (guarded). Nothing inside a
    graph writes ``.grad`` (``backward()`` breaks the graph, assigning ``.grad`` breaks it), so the value
    read when the graph starts is the value at this point. NOT_AN_INPUT for a tensor computed in the graph."""
    source, real = input_value(tracer, t)
    if real is None:
        return NOT_AN_INPUT
    return tracer.wrap(real.grad, attr_source(source, "grad"))


def input_value(tracer: Any, t: torch.Tensor) -> tuple[str, torch.Tensor | None]:
    """(source, the caller's tensor) of the graph input ``t``; ("", None) for a tensor computed in the graph."""
    source = tracer.input_source_of_fake.get(id(t))
    real = next((i.value for i in tracer.inputs if i.fake is t), None) if source is not None else None
    return (source, real) if isinstance(real, torch.Tensor) else ("", None)


def store_attr(frame: Frame, obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, torch.Tensor):
        raise GraphBreak(f"setting tensor attribute {name!r}")
    if frame.tracer.source_of.get(id(obj)) is not None:
        record_attr_write(frame, obj, name, value)
        return
    if isinstance(obj, nn.Module) and id(obj) in frame.tracer.made:  # a module built in the trace
        setter = lookup_static(type(obj), "__setattr__")
        static = lookup_static(type(obj), name)
        if isinstance(static, property) and isinstance(static.fset, types.FunctionType):
            frame.call(static.fset, [obj, value], {})
        elif setter is not nn.Module.__setattr__ and isinstance(setter, types.FunctionType):
            frame.call(setter, [obj, name, value], {})
        else:  # registers submodules, parameters and buffers on the trace's own object
            frame.tracer.note_setattr(obj, name)
            setattr(obj, name, value)
        return
    if isinstance(obj, (nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        raise GraphBreak(f"mutation of attribute {name!r} on an object from outside the compiled code",
                         "attribute writes on inputs run in Python")
    static = lookup_static(type(obj), name)
    if isinstance(static, property) and isinstance(static.fset, types.FunctionType):
        frame.call(static.fset, [obj, value], {})
        return
    frame.tracer.note_setattr(obj, name)
    setattr(obj, name, value)


def record_attr_write(frame: Frame, obj: Any, name: str, value: Any) -> None:
    """Defer a write to an object the trace does not own: reads see it, the graph's caller replays it."""
    if isinstance(obj, nn.Module) and isinstance(value, torch.Tensor) and name in obj._buffers and \
            obj._buffers[name] is not None and load_attr(frame, obj, name) is value:
        return  # ``self.count += 1`` on a buffer: updated in place (the graph writes it back), the same object
    if isinstance(obj, nn.Module) and isinstance(value, (torch.Tensor, nn.Module)) or \
            isinstance(obj, nn.Module) and name in ("training",):
        raise GraphBreak(f"assigning {name!r} on module {type(obj).__name__}")
    frame.tracer.attr_writes[(id(obj), name)] = (obj, name, value)


def delete_attr(frame: Frame, obj: Any, name: str) -> None:
    if frame.tracer.source_of.get(id(obj)) is not None:
        load_attr(frame, obj, name)  # AttributeError if it is not there
        frame.tracer.attr_writes[(id(obj), name)] = (obj, name, DELETED)
        return
    if isinstance(obj, (nn.Module, type, types.ModuleType, torch.Tensor)):
        raise GraphBreak(f"deleting attribute {name!r}")
    frame.tracer.note_setattr(obj, name)
    delattr(obj, name)


# ---- items ------------------------------------------------------------------------------
def getitem(frame: Frame, obj: Any, key: Any) -> Any:
    tracer = frame.tracer
    if isinstance(obj, NumpyArray):
        return array_getitem(frame, obj, key)
    if isinstance(obj, torch.Tensor):
        def index() -> Any:
            fast = fast_getitem(obj, key)  # basic indexing: one as_strided instead of a chain of views
            return obj[key] if fast is None else fast
        return tracer.record("call_function", operator.getitem, (obj, key), {}, index)
    if isinstance(key, torch.Tensor) and isinstance(obj, dict) and tracer.source_of.get(id(obj)) is not None:
        return tensor_keyed_item(frame, obj, key)
    if is_traced(key) and not isinstance(key, torch.SymInt):
        raise GraphBreak("indexing a Python container with a tensor")
    if isinstance(obj, (nn.ModuleList, nn.Sequential, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)):
        src = tracer.source_of.get(id(obj))
        if isinstance(key, slice) or not isinstance(key, int) or key < 0:
            guard_members(tracer, obj)  # a slice or a negative index reads how many members there are
        if isinstance(key, slice) and isinstance(obj, nn.ModuleList):
            names = list(obj._modules.keys())[key]  # a plain list of the submodules, with their sources
            return [tracer.wrap(obj._modules[n], module_member_source(src, "_modules", n) if src else None)
                    for n in names]
        if isinstance(key, slice):
            return frame.call(type(obj).__getitem__, [obj, key], {})
        if isinstance(obj, (nn.ModuleList, nn.Sequential)):
            idx = operator.index(key)
            n = len(obj)
            idx = idx + n if idx < 0 else idx
            name = list(obj._modules.keys())[idx]
            return tracer.wrap(obj._modules[name], module_member_source(src, "_modules", name) if src else None)
        if isinstance(obj, nn.ModuleDict):
            return tracer.wrap(obj._modules[key], module_member_source(src, "_modules", key) if src else None)
        value = obj[key]
        return tracer.wrap(value, item_source(src, key) if src else None)
    key = concrete_key(key)
    if type(obj) in (list, tuple, dict) or isinstance(obj, (str, range, torch.Size)):
        return obj[key]
    if isinstance(obj, collections.defaultdict) and obj.default_factory is not None and key not in obj:
        # eager calls the factory (the user's code: a counter, a log) and stores its value; run for real
        # here, it ran once at capture and its value was a constant of the graph
        value = frame.call(obj.default_factory, [], {})
        setitem(frame, obj, key, value)
        return value
    getitem_fn = lookup_static(type(obj), "__getitem__")
    if isinstance(getitem_fn, types.FunctionType):
        return frame.call(getitem_fn, [obj, key], {})
    src = tracer.source_of.get(id(obj))
    if isinstance(obj, (tuple, list, dict)):
        if src is None or tracer.owns_copy(obj) or type(key) not in (int, str):
            return obj[key]  # a traced copy (its items are traced values) or a container built in the trace
        # a list/dict subclass from outside used as itself (a library's registry, a dict subclass whose
        # __getattr__ reads ``self[name]``): the item read through its source, not the real value
        return tracer.wrap(obj[key], item_source(src, key))
    if src is not None and type(key) in (int, str):
        return tracer.wrap(obj[key], item_source(src, key))
    refuse_foreign_values(frame, [obj], "indexing")
    value = obj[key]
    check_tracked(frame, value, "item")
    return value


def tensor_keyed_item(frame: Frame, obj: dict, key: torch.Tensor) -> Any:
    """``d[p]`` where ``d`` comes from outside the compiled code and ``p`` is a graph input (an optimizer's
    ``state[p]``): the value read through ``d.get(<p's source>)``, guarded like any other read (a missing
    key is guarded as None; ``get`` never runs a defaultdict's factory while checking guards)."""
    tracer = frame.tracer
    key_source, real = input_value(tracer, key)
    if real is None:
        raise GraphBreak("indexing a Python container with a tensor computed in the graph")
    source = f"{tracer.source_of[id(obj)]}.get({key_source})"
    value = dict.get(obj, real)
    if value is None:
        tracer.wrap(None, source)  # this entry serves calls where the key is still missing
        raise GraphBreak(f"{type(obj).__name__}[tensor] creates the entry of a tensor not in it yet (an optimizer's "
                         "state on its first step)", "that call runs in Python; later ones are captured")
    return tracer.wrap(value, source)


def refuse_overlapping_write(t: torch.Tensor, reads: Any, what: str, written: torch.Tensor | None = None) -> None:
    """Break the graph before ``what`` writes ``written`` (a view of ``t``; ``t`` itself when not given) where
    eager's order of element writes decides the values, or eager refuses: ``t``'s elements share memory
    (expand, overlapping unfold windows), or a tensor among ``reads`` is another view partly over the memory
    written (``x.mul_(x.t())``, ``x[:, 1:] += x[:, :-1]``; a graph read the old values)."""
    if may_overlap_itself(t.shape, t.stride()):
        raise GraphBreak(f"{what} writes a view whose elements share memory ({tuple(t.shape)} strided "
                         f"{tuple(t.stride())}: expand, overlapping unfold windows)",
                         "it runs in Python between graphs (the order of the writes decides the values)")
    dst = t if written is None else written
    if any(partly_overlaps(dst, u) for u in reads):
        raise GraphBreak(f"{what} reads another view of the memory it writes",
                         "it runs in Python between graphs (eager's element order decides the values, or eager "
                         "refuses a partial overlap)")


def partly_overlaps(t: torch.Tensor | None, u: Any) -> bool:
    """Whether ``u`` is another view of memory ``t`` (written in place) also holds: same storage,
    another layout, elements in common. ``x.mul_(x)`` reads exactly what it writes; ``x.mul_(x.t())``
    and ``x[1:].add_(x[:-1])`` do not (eager raises)."""
    if t is None or not isinstance(u, torch.Tensor) or u is t or not contains_traced(u):
        return False
    try:
        if t.untyped_storage()._cdata != u.untyped_storage()._cdata:
            return False
    except Exception:  # noqa: BLE001 - a tensor without a plain storage: not decided here
        return False
    if (tuple(t.shape), tuple(t.stride()), t.storage_offset()) == (tuple(u.shape), tuple(u.stride()), u.storage_offset()):
        return False
    a, b = byte_span(t), byte_span(u)
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1] and not share_no_element(t, u)


def _written_view(tracer: Any, obj: torch.Tensor, key: Any) -> Any:
    """``obj[key]`` on the fake tensors (None when it cannot be computed so: a copy's overlap is moot)."""
    try:
        with tracer.fake_mode:
            return obj[key]
    except Exception:  # noqa: BLE001 - advanced indexing with traced values etc.: no view to compare
        return None


def setitem(frame: Frame, obj: Any, key: Any, value: Any) -> None:
    tracer = frame.tracer
    if isinstance(obj, NumpyArray):
        array_setitem(frame, obj, key, value)
        return
    if isinstance(obj, torch.Tensor):
        if contains_traced(obj):
            reads = (value,) if isinstance(value, torch.Tensor) else ()
            refuse_overlapping_write(obj, reads, "an item write", _written_view(tracer, obj, key) if reads else None)
        tracer.record("call_function", operator.setitem, (obj, key, value), {},
                      lambda: obj.__setitem__(key, value))
        return
    if tracer.source_of.get(id(obj)) is not None:
        if not tracer.owns_copy(obj):
            raise GraphBreak(f"item write on a {type(obj).__name__} from outside the compiled code",
                             "item writes on input lists and dicts are replayed; other containers break")
        tracer.note_container_write(obj)
    if isinstance(obj, dict):
        key = concrete_key(key)
    setitem_fn = lookup_static(type(obj), "__setitem__")
    if isinstance(setitem_fn, types.FunctionType):
        frame.call(setitem_fn, [obj, key, value], {})
        return
    obj[key] = value


def concrete_key(key: Any) -> Any:
    """A symbolic number (or a tuple of them) used as a key, specialised to its value (a guard of the
    shape env): SymInts do not hash, and a dict or set lookup by one (``cache[x.shape[0]]``,
    ``n in seen``) answers for this value only."""
    if isinstance(key, tuple) and any(isinstance(k, SYM_TYPES) for k in key):
        return tuple(concrete_key(k) for k in key)
    if isinstance(key, torch.SymInt):
        return int(key)
    if isinstance(key, torch.SymFloat):
        return float(key)
    if isinstance(key, torch.SymBool):
        return bool(key)
    return key


def delitem(frame: Frame, obj: Any, key: Any) -> None:
    if frame.tracer.owns_copy(obj):
        frame.tracer.note_container_write(obj)
    elif isinstance(obj, torch.Tensor) or frame.tracer.source_of.get(id(obj)) is not None:
        raise GraphBreak("deleting an item of a tensor or an input container")
    del obj[key]


# ---- operators ----------------------------------------------------------------------------
BINARY_OPS: dict[str, Any] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE_OPS: dict[str, Any] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
    ">=": operator.ge,
}


def apply_operator(frame: Frame, op: Any, args: list) -> Any:
    """Apply an ``operator`` function: recorded if a tensor/size is involved, real otherwise."""
    if any(isinstance(a, NumpyArray) for a in args):
        return numpy_operator(frame, op, args)
    if any(is_traced(a) for a in args):
        inplace_on_python = op in _INPLACE and not isinstance(args[0], torch.Tensor)
        target = _NOT_INPLACE.get(op, op) if inplace_on_python else op
        if op in _INPLACE and isinstance(args[0], torch.Tensor) and contains_traced(args[0]):
            refuse_overlapping_write(args[0], args[1:], "an in-place operator")
        if any(isinstance(a, torch.Tensor) for a in args) or any(contains_traced(a) for a in args):
            rule = FAST_POINTWISE.get(id(target))

            def run() -> Any:
                fast = rule(tuple(args), {}) if rule is not None else None  # + - * / ** by shape rule
                return target(*args) if fast is None else fast
            return frame.tracer.record("call_function", target, tuple(args), {}, run,
                                       pure=not any(isinstance(a, torch.Tensor) for a in args))
    if op in _INPLACE and frame.tracer.source_of.get(id(args[0])) is not None and \
            isinstance(args[0], (list, dict, set)):
        if not frame.tracer.owns_copy(args[0]):
            raise GraphBreak("in-place operator on a container from outside the compiled code")
        frame.tracer.note_container_write(args[0])
    user = _user_dunder(args, op)
    if user is not None:
        return frame.call(user[0], user[1], {})
    refuse_foreign_values(frame, args, getattr(op, "__name__", "operator"))
    return op(*args)


def numpy_operator(frame: Frame, op: Any, args: list) -> Any:
    """An operator with a traced numpy array among its operands (numpy_trace.py)."""
    if any(is_python_draw(a) for a in args) and op is not operator.getitem:
        return python_operator(frame, op, args, apply_operator)  # np.random.rand(): a Python float
    if op is operator.getitem:
        return getitem(frame, args[0], args[1])
    if len(args) == 1:
        return unary(frame, op, args[0])
    if op is operator.contains:
        raise GraphBreak("`in` on a numpy array")
    other = args[1] if isinstance(args[0], NumpyArray) else args[0]
    if isinstance(other, torch.Tensor):  # tensor op numpy scalar: torch treats it as a Python number
        arr = args[0] if other is args[1] else args[1]
        if not (arr.scalar and arr.t.dtype.is_floating_point and other.dtype.is_floating_point):
            raise GraphBreak("mixing a tensor and a numpy array in one operation")
        return apply_operator(frame, op, [arr.t if a is arr else a for a in args])
    return binary(frame, op, args[0], args[1])


def refuse_foreign_values(frame: Frame, values: Any, what: str) -> None:
    """Computing at capture time on an object guarded by its type only (a numpy array, a set, a
    deque, a C object from the frame) would bake one call's contents into the entry: that runs in
    Python instead (see foreign.py)."""
    tracer = frame.tracer
    for v in values:
        items = v if type(v) in (list, tuple) else (v,)
        for x in items:
            if is_ndarray(x) or tracer.is_opaque(x):
                kind = "numpy ndarray" if is_ndarray(x) else type(x).__name__
                raise GraphBreak(f"{what} on a {kind} from outside the compiled code (only its type is guarded)",
                                 "it runs in Python between graphs, on each call's own data")


_INPLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
            operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
            operator.ixor, operator.ilshift, operator.irshift}
_NOT_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul}
_DUNDER = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
           operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
           operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
           operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
           operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
           operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
           operator.rshift: ("__rshift__", "__rrshift__"),
           operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
           operator.lt: ("__lt__", "__gt__"), operator.gt: ("__gt__", "__lt__"),
           operator.le: ("__le__", "__ge__"), operator.ge: ("__ge__", "__le__"),
           operator.getitem: ("__getitem__", None),
           operator.neg: ("__neg__", None), operator.pos: ("__pos__", None),
           operator.invert: ("__invert__", None), operator.abs: ("__abs__", None)}
_INPLACE_DUNDER = {operator.iadd: "__iadd__", operator.isub: "__isub__", operator.imul: "__imul__",
                   operator.itruediv: "__itruediv__", operator.ifloordiv: "__ifloordiv__",
                   operator.imod: "__imod__", operator.ipow: "__ipow__", operator.imatmul: "__imatmul__"}


def _user_dunder(args: list, op: Any) -> tuple[Any, list] | None:
    """A Python-level dunder on a user class (so the trace inlines it); in-place operators fall
    back to the binary one as Python does."""
    if op in _INPLACE_DUNDER:
        own = lookup_static(type(args[0]), _INPLACE_DUNDER[op])
        if isinstance(own, types.FunctionType):
            return own, list(args)
        op = _NOT_INPLACE.get(op, op)
    names = _DUNDER.get(op)
    if not names or len(args) != (1 if names[1] is None and op is not operator.getitem else 2):
        return None
    fwd = lookup_static(type(args[0]), names[0])
    if isinstance(fwd, types.FunctionType):
        return fwd, list(args)
    if names[1] and len(args) == 2:
        rev = lookup_static(type(args[1]), names[1])
        if isinstance(rev, types.FunctionType):
            return rev, [args[1], args[0]]
    return None


def truth(frame: Frame, v: Any) -> bool:
    if isinstance(v, NumpyArray):
        raise GraphBreak("data-dependent control flow: the truth value of a numpy array")
    if isinstance(v, torch.Tensor):
        raise GraphBreak("data-dependent control flow: the truth value of a tensor",
                         "use torch.where / torch.cond, or accept a graph break here")
    if isinstance(v, SYM_TYPES):
        return bool(v)  # ShapeEnv records the guard
    if isinstance(v, (list, tuple, dict, str, int, float, type(None), bool)):
        return bool(v)
    boolfn = lookup_static(type(v), "__bool__")
    lenfn = lookup_static(type(v), "__len__")
    if isinstance(boolfn, types.FunctionType) or isinstance(lenfn, types.FunctionType) and boolfn is None:
        return bool(frame.call(boolfn or lenfn, [v], {}))
    refuse_foreign_values(frame, [v], "truth value")
    return bool(v)


def contains(frame: Frame, item: Any, container: Any) -> bool:
    if isinstance(container, torch.Tensor) or isinstance(item, torch.Tensor) and \
            not isinstance(container, (list, tuple, dict, set)):
        raise GraphBreak("`in` on a tensor")
    if isinstance(container, (list, tuple)) and isinstance(item, torch.Tensor):
        return any(x is item for x in container)
    refuse_foreign_values(frame, [container], "`in`")
    if isinstance(container, (dict, set, frozenset, collections.abc.KeysView)):
        item = concrete_key(item)
    return item in container


# ---- iteration ------------------------------------------------------------------------------
def get_iter(frame: Frame, obj: Any) -> Any:
    if isinstance(obj, InterpIterator):
        return obj
    if isinstance(obj, NumpyArray):
        return ListIterator([array_getitem(frame, obj, i) for i in range(int(obj.t.shape[0]))], frame.tracer.advances)
    if isinstance(obj, torch.Tensor):
        n = obj.shape[0]
        n = int(n)  # a symbolic length is specialised (ShapeEnv records the guard)
        return ListIterator([getitem(frame, obj, i) for i in range(n)], frame.tracer.advances)
    if isinstance(obj, (list, tuple, range, torch.Size, str)):
        return ListIterator(list(obj), frame.tracer.advances)
    if isinstance(obj, dict):
        return ListIterator(list(obj.keys()), frame.tracer.advances)
    if isinstance(obj, (nn.ModuleList, nn.Sequential)):
        guard_members(frame.tracer, obj)  # a member appended later is iterated too
        return ListIterator([getitem(frame, obj, i) for i in range(len(obj))], frame.tracer.advances)
    if isinstance(obj, nn.ModuleDict):
        guard_members(frame.tracer, obj)
        return ListIterator(list(obj.keys()), frame.tracer.advances)
    if isinstance(obj, (set, frozenset)):
        refuse_foreign_values(frame, [obj], "iteration")
        return ListIterator(list(obj), frame.tracer.advances)
    if isinstance(obj, (type({}.keys()), type({}.values()), type({}.items()), enumerate, zip,
                        reversed, map, filter)) or type(obj).__name__ in ("list_iterator", "tuple_iterator",
                                                                           "range_iterator"):
        refuse_foreign_values(frame, [obj], "iteration")  # the caller's iterator: consumed here for real
        return ListIterator(list(obj), frame.tracer.advances)
    iter_fn = lookup_static(type(obj), "__iter__")
    if isinstance(iter_fn, types.FunctionType):
        return get_iter(frame, frame.call(iter_fn, [obj], {}))
    if hasattr(obj, "__next__") and isinstance(lookup_static(type(obj), "__next__"), types.FunctionType):
        raise GraphBreak(f"iterating a user iterator of type {type(obj).__name__}")
    refuse_foreign_values(frame, [obj], "iteration")
    items = list(obj)
    check_tracked(frame, items, "iteration")
    return ListIterator(items, frame.tracer.advances)


def guard_members(tracer: Any, obj: nn.Module) -> None:
    """The names and order of a module container's members, guarded (what iterating it, slicing it or a
    negative index reads; ``layers.append(...)`` after a call was not seen before)."""
    src = tracer.source_of.get(id(obj))
    if src is not None:
        table = "_parameters" if isinstance(obj, (nn.ParameterList, nn.ParameterDict)) else "_modules"
        tracer.add_guard(attr_source(src, table), "DICT_KEYS", tuple(getattr(obj, table).keys()))


def check_tracked(frame: Frame, value: Any, what: str) -> None:
    """Refuse a value holding fake tensors the graph does not know (computed behind our back)."""
    tracer = frame.tracer
    if isinstance(value, torch.Tensor):
        if id(value) not in tracer.node_of:
            raise GraphBreak(f"{what} produced a tensor outside the graph")
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_tracked(frame, v, what)
    elif isinstance(value, dict):
        for v in value.values():
            check_tracked(frame, v, what)
