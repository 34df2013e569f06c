"""Builtins and torch helpers with interpreter-specific meaning, in one typed table (``SPECIAL``)."""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import math
import operator
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.utils.checkpoint as torch_checkpoint

from . import controls, deferred, polyfills
from .errors import GraphBreak, SkipFrame
from .generators import is_lazy, lazy_enumerate, lazy_map, lazy_zip
from .semantics import (
    apply_operator,
    contains,
    contains_traced,
    get_iter,
    getitem,
    is_traced,
    load_attr,
    lookup_static,
    refuse_foreign_values,
    setitem,
    store_attr,
    truth,
)
from .values import (
    EMPTY,
    AutocastContext,
    GradModeContext,
    InterpIterator,
    ListIterator,
    NullContext,
    NumpyArray,
    SuperProxy,
    TensorMethod,
    TracedFunction,
    TracedMethod,
)

if TYPE_CHECKING:
    from .frame import Frame

Handler = Callable[["Frame", list, dict], Any]
SPECIAL: dict[Any, Handler] = {}


def _items(frame: Frame, x: Any) -> list:
    return list(get_iter(frame, x).remaining())


def _len(frame: Frame, args: list, kwargs: dict) -> Any:
    (x,) = args
    if isinstance(x, torch.Tensor):
        return x.shape[0]
    if isinstance(x, ListIterator):
        return len(x.remaining())
    if isinstance(x, NumpyArray):
        if x.t.dim() == 0:
            raise TypeError("len() of unsized object")
        return int(x.t.shape[0])
    fn = lookup_static(type(x), "__len__")
    if fn is not None and not isinstance(fn, type(list.__len__)) and callable(fn) and hasattr(fn, "__code__"):
        return frame.call(fn, [x], {})
    refuse_foreign_values(frame, [x], "len()")
    return len(x)


# A dynamic number stands for the caller's int/float/bool: isinstance and type answer as for it
# (``isinstance(n, int)`` was False once n became a symbol on its second value, taking another branch).
_SYMBOLIC_NUMBER_TYPE: dict[type, type] = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _isinstance(frame: Frame, args: list, kwargs: dict) -> bool:
    obj, cls = args
    if isinstance(obj, torch.Tensor) and id(obj) in frame.tracer.param_fakes:
        classes = cls if isinstance(cls, tuple) else (cls,)
        return any(issubclass(torch.nn.Parameter, c) for c in classes)
    number_type = _SYMBOLIC_NUMBER_TYPE.get(type(obj))
    if number_type is not None:
        return issubclass(number_type, cls)
    return isinstance(obj, cls)


def _type(frame: Frame, args: list, kwargs: dict) -> Any:
    if len(args) == 1:
        obj = args[0]
        if isinstance(obj, torch.Tensor):
            return torch.nn.Parameter if id(obj) in frame.tracer.param_fakes else torch.Tensor
        return _SYMBOLIC_NUMBER_TYPE.get(type(obj), type(obj))
    return type(*args, **kwargs)


def _getattr(frame: Frame, args: list, kwargs: dict) -> Any:
    obj, name, *default = args
    try:
        return load_attr(frame, obj, name)
    except AttributeError:
        if default:
            return default[0]
        raise


def _hasattr(frame: Frame, args: list, kwargs: dict) -> bool:
    obj, name = args
    try:
        load_attr(frame, obj, name)
        return True
    except AttributeError:
        return False


def _setattr(frame: Frame, args: list, kwargs: dict) -> None:
    store_attr(frame, args[0], args[1], args[2])


def _iter(frame: Frame, args: list, kwargs: dict) -> Any:
    return get_iter(frame, args[0])


def _next(frame: Frame, args: list, kwargs: dict) -> Any:
    it = args[0]
    if not isinstance(it, InterpIterator):
        raise GraphBreak(f"next() on {type(it).__name__}")
    try:
        return it.next()
    except StopIteration:
        if len(args) > 1:
            return args[1]
        raise


def _enumerate(frame: Frame, args: list, kwargs: dict) -> InterpIterator:
    start = args[1] if len(args) > 1 else kwargs.get("start", 0)
    if is_lazy(args[0]):  # over a generator: pulled one item at a time (generators.py)
        return lazy_enumerate(args[0], start)
    return ListIterator([(start + i, v) for i, v in enumerate(_items(frame, args[0]))], frame.tracer.advances)


def _zip(frame: Frame, args: list, kwargs: dict) -> InterpIterator:
    strict = kwargs.get("strict", False)
    if any(is_lazy(a) for a in args):
        return lazy_zip([get_iter(frame, a) for a in args], strict)
    lists = [_items(frame, a) for a in args]
    if strict and len({len(x) for x in lists}) > 1:
        raise ValueError("zip() arguments have different lengths")
    return ListIterator([tuple(t) for t in zip(*lists)], frame.tracer.advances)


def _reversed(frame: Frame, args: list, kwargs: dict) -> ListIterator:
    x = args[0]
    fn = lookup_static(type(x), "__reversed__")
    if fn is not None and hasattr(fn, "__code__"):
        return get_iter(frame, frame.call(fn, [x], {}))
    return ListIterator(list(reversed(_items(frame, x))), frame.tracer.advances)


def _container(kind: type) -> Handler:
    def make(frame: Frame, args: list, kwargs: dict) -> Any:
        if not args:
            return kind(**kwargs) if kind is dict else kind()
        x = args[0]
        if kind is dict:
            if isinstance(x, dict):
                out = dict(x)
            else:
                out = dict(_items(frame, x))
            out.update(kwargs)
            return out
        return kind(_items(frame, x))
    return make


def _polyfill(real: Callable, poly: Callable) -> Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        flat = [a for a in args]
        if real is map and len(args) > 1 and any(is_lazy(a) for a in args[1:]):
            return lazy_map(frame, args[0], [get_iter(frame, a) for a in args[1:]])
        if any(isinstance(a, InterpIterator) or contains_traced(a) for a in flat) or \
                any(isinstance(v, (TracedFunction, TracedMethod)) or callable(v) and hasattr(v, "__code__")
                    for v in [*args, *kwargs.values()]) or \
                any(not isinstance(a, (list, tuple, range, set, dict, int, float, str, bool)) for a in flat):
            return frame.call(poly, list(args), kwargs)
        return real(*args, **kwargs)
    return call


def _abs(frame: Frame, args: list, kwargs: dict) -> Any:
    return apply_operator(frame, operator.abs, list(args))


def _super(frame: Frame, args: list, kwargs: dict) -> SuperProxy:
    if args:
        return SuperProxy(args[0], args[1])
    cell = frame.cells.get("__class__")
    if cell is None or cell.value is EMPTY and cell.real is None:
        raise GraphBreak("super() without __class__ cell")
    cls = cell.value if cell.real is None else cell.real.cell_contents
    first = frame.code.co_varnames[0]
    obj = frame.locals.get(first)
    if obj is None and first in frame.cells:
        obj = frame.cells[first].value
    return SuperProxy(cls, obj)


def _scalar(kind: Callable[..., Any]) -> Handler:
    def conv(frame: Frame, args: list, kwargs: dict) -> Any:
        if args and isinstance(args[0], (torch.Tensor, NumpyArray)):
            raise GraphBreak(f"data-dependent {kind.__name__}() of a tensor or numpy array",
                             "keep the value as a tensor, or accept the graph break")
        if kind is float and len(args) == 1 and not kwargs and _symbolic_number(args[0]):
            return _record_sym(frame, torch.sym_float, args[0])
        if kind is int and len(args) == 1 and not kwargs and _symbolic_number(args[0]):
            # int(n * 0.5) truncates symbolically (torch.sym_int), as torch's compiler does: int() of the
            # value would pin the graph to this size; int() of a SymInt is the SymInt itself
            v = args[0]
            return v if isinstance(v, torch.SymInt) else _record_sym(frame, torch.sym_int, v)
        return kind(*args, **kwargs)
    return conv


def _symbolic_number(v: Any) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat)) and not v.node.expr.is_number


def _record_sym(frame: Frame, fn: Any, v: Any) -> Any:
    """``fn(v)`` of a symbolic size as a graph node: a SymFloat over the size, not a specialised one."""
    return frame.tracer.record("call_function", fn, (v,), {}, lambda: fn(v), pure=True)


def _sym_math(fn: Any, sym_fn: Any) -> Handler:
    """``math.sqrt(n)`` of a symbolic size: recorded as torch's symbolic form (``torch.sym_sqrt``)
    instead of run on the size's value, which would specialise the graph to that size."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        if len(args) == 1 and not kwargs and _symbolic_number(args[0]):
            return _record_sym(frame, sym_fn, args[0])
        if any(isinstance(a, (torch.Tensor, NumpyArray)) for a in args):
            raise GraphBreak(f"data-dependent math.{fn.__name__}() of a tensor or numpy array",
                             "use the torch function on the tensor, or accept the graph break")
        return fn(*args, **kwargs)
    return call


def _id(frame: Frame, args: list, kwargs: dict) -> int:
    if is_traced(args[0]):
        raise GraphBreak("id() of a tensor")
    return id(args[0])


def _grad_mode(enabled: bool) -> Handler:
    def make(frame: Frame, args: list, kwargs: dict) -> GradModeContext:
        return GradModeContext(enabled)
    return make


def _set_grad_enabled(frame: Frame, args: list, kwargs: dict) -> GradModeContext:
    mode = bool(args[0] if args else kwargs["mode"])
    ctx = GradModeContext(mode, prev=torch.is_grad_enabled())
    set_grad_mode(frame, mode)
    return ctx


def set_grad_mode(frame: Frame, mode: bool) -> None:
    if torch.is_grad_enabled() != mode:
        node = frame.tracer.graph.call_function(torch._C._set_grad_enabled, (mode,))
        node.meta["val"] = None
        torch._C._set_grad_enabled(mode)


def _autocast(frame: Frame, args: list, kwargs: dict) -> AutocastContext:
    def parse(device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None):
        return AutocastContext(device_type, dtype, enabled, cache_enabled)
    return parse(*args, **kwargs)


def _module_members(kind: str) -> Handler:
    """nn.Module.parameters() & co: the real members, each lifted through its attribute path."""
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        module, *rest = args
        src = frame.tracer.source_of.get(id(module))
        method = getattr(type(module), kind)
        named = kind.startswith("named_")
        items = list(method(module, *rest, **kwargs))
        out = []
        for item in items:
            name, value = item if named else (None, item)
            if name is None:
                name = _member_name(module, value, kind)
            vsrc = _member_source(src, module, name) if (src and name is not None) else None
            wrapped = frame.tracer.wrap(value, vsrc) if vsrc else (
                value if isinstance(value, torch.nn.Module) else frame.tracer.wrap(value, None))
            out.append((name, wrapped) if named else wrapped)
        return ListIterator(out, frame.tracer.advances)
    return call


def _member_name(module: Any, value: Any, kind: str) -> str | None:
    table = {"parameters": "named_parameters", "buffers": "named_buffers", "children": "named_children",
             "modules": "named_modules"}[kind]
    for n, v in getattr(module, table)():
        if v is value:
            return n
    return None


def _member_source(src: str, module: Any, dotted: str) -> str:
    if dotted == "":
        return src
    parts = dotted.split(".")
    out, cur = src, module
    for p in parts[:-1]:
        out, cur = f"{out}._modules[{p!r}]", cur._modules[p]
    last = parts[-1]
    for table in ("_parameters", "_buffers", "_modules"):
        if last in cur.__dict__.get(table, {}):
            return f"{out}.{table}[{last!r}]"
    return f"{out}.{last}"


def _refuse(what: str, hint: str) -> Handler:
    def refuse(frame: Frame, args: list, kwargs: dict) -> Any:
        raise GraphBreak(what, hint)
    return refuse


def _frame_locals(frame: Frame) -> dict[str, Any]:
    """``locals()`` of the interpreted frame, as CPython builds it: the bound fast locals, then the
    bound cell and free variables (names in the code's order). A builtin called for real would return
    the dict of kiln's own frame that called it."""
    code, out = frame.code, {}
    for name in (*code.co_varnames, *code.co_cellvars, *code.co_freevars):
        if name in out:
            continue
        cell = frame.cells.get(name)
        if cell is None:
            value = frame.locals.get(name, EMPTY)
        else:
            try:
                value = _read_cell(frame, cell, name)  # a real cell's contents wrapped and guarded
            except NameError:  # unbound: not in locals()
                value = EMPTY
        if value is not EMPTY:
            out[name] = value
    return out


def _read_cell(frame: Frame, cell: Any, name: str) -> Any:
    from .op_names import read_cell as read

    return read(frame, cell, name)


def _locals(frame: Frame, args: list, kwargs: dict) -> Any:
    if args or kwargs:
        raise TypeError(f"locals() takes no arguments ({len(args) + len(kwargs)} given)")
    return _frame_locals(frame)


def _vars(frame: Frame, args: list, kwargs: dict) -> Any:
    if not args and not kwargs:
        return _frame_locals(frame)
    if len(args) != 1 or kwargs:
        raise TypeError(f"vars expected at most 1 argument, got {len(args) + len(kwargs)}")
    return load_attr(frame, args[0], "__dict__")  # as obj.__dict__: what is read through it is guarded


def _dir(frame: Frame, args: list, kwargs: dict) -> Any:
    if not args and not kwargs:
        return sorted(_frame_locals(frame))
    (obj,) = args
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        load_attr(frame, obj, "__dict__")  # the instance's names are read: guarded as obj.__dict__ is
    return dir(obj)


def _frame_object(what: str) -> Handler:
    """A call that returns or walks the Python frames (``sys._getframe``, ``inspect.currentframe``):
    the interpreted frame has no frame object, and the real call would see kiln's. The top frame runs
    in Python (SkipFrame); an inlined function breaks the graph, so its call runs in Python with its
    own frame."""
    def handler(frame: Frame, args: list, kwargs: dict) -> Any:
        reason = f"{what} reads the Python frame, which the capture does not model"
        if frame.is_top():  # a break would run the call from kiln's interpreter (python_step.py)
            raise SkipFrame(f"{frame.code.co_name} calls {what}, which reads its Python frame")
        raise GraphBreak(reason, "the call of the function that uses it runs in Python")
    return handler


def _constant(value: Any) -> Handler:
    return lambda frame, args, kwargs: value


def _text(fn: Callable) -> Handler:
    """str()/repr() of symbolic sizes specialise them (a guard), so the text is a real number."""
    def handler(frame: Frame, args: list, kwargs: dict) -> Any:
        from .op_build import _concrete

        if len(args) == 1 and not kwargs:
            if isinstance(args[0], torch.Tensor):
                raise GraphBreak(f"{fn.__name__}() of a tensor", "formatting tensors runs in Python")
            return fn(_concrete(args[0]))
        from .calls import real_call

        return real_call(frame, fn, args, kwargs)
    return handler


def _keep_wrapper(wrapper: Any) -> Any:
    return wrapper


def _wraps(frame: Frame, args: list, kwargs: dict) -> Any:
    """``functools.wraps(fn)`` inside compiled code: the decorator returns the wrapper itself (its
    metadata is not copied; the wrapper only lives inside the trace)."""
    if not any(isinstance(a, (TracedFunction, TracedMethod)) for a in args):
        return functools.wraps(*args, **kwargs)
    return _keep_wrapper


def _nullcontext(frame: Frame, args: list, kwargs: dict) -> NullContext:
    return NullContext(contextlib.nullcontext(*args, **kwargs))


def _no_graph_effect(cls: Any) -> Handler:
    """A context manager that changes nothing a graph of plain tensors computes (torch-function
    subclass dispatch switches, profiler ranges): entered and left for real at capture time only."""
    def make(frame: Frame, args: list, kwargs: dict) -> NullContext:
        return NullContext(cls(*args, **kwargs))
    return make


def _operator_fn(fn: Any) -> Handler:
    def call(frame: Frame, args: list, kwargs: dict) -> Any:
        return apply_operator(frame, fn, list(args))
    return call


def _register_operators() -> None:
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_",
                 "xor", "lshift", "rshift", "neg", "pos", "invert", "lt", "le", "eq", "ne", "gt", "ge",
                 "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "abs"):
        fn = getattr(operator, name)
        SPECIAL[fn] = _operator_fn(fn)
    SPECIAL[operator.getitem] = lambda frame, args, kwargs: getitem(frame, args[0], args[1])
    SPECIAL[operator.setitem] = lambda frame, args, kwargs: setitem(frame, args[0], args[1], args[2])
    SPECIAL[operator.contains] = lambda frame, args, kwargs: contains(frame, args[1], args[0])
    SPECIAL[operator.truth] = lambda frame, args, kwargs: truth(frame, args[0])
    SPECIAL[operator.not_] = lambda frame, args, kwargs: not truth(frame, args[0])
    SPECIAL[operator.index] = _scalar(operator.index)


def _register() -> None:
    b = builtins
    SPECIAL.update({
        b.len: _len, b.isinstance: _isinstance, b.type: _type, b.getattr: _getattr,
        b.hasattr: _hasattr, b.setattr: _setattr, b.iter: _iter, b.next: _next,
        b.enumerate: _enumerate, b.zip: _zip, b.reversed: _reversed,
        b.list: _container(list), b.tuple: _container(tuple), b.set: _container(set),
        b.frozenset: _container(frozenset), b.dict: _container(dict),
        b.sum: _polyfill(sum, polyfills.sum_), b.min: _polyfill(min, polyfills.min_),
        b.max: _polyfill(max, polyfills.max_), b.any: _polyfill(any, polyfills.any_),
        b.all: _polyfill(all, polyfills.all_), b.map: _polyfill(map, polyfills.map_),
        b.filter: _polyfill(filter, polyfills.filter_), b.sorted: _polyfill(sorted, polyfills.sorted_),
        b.callable: lambda frame, args, kwargs: isinstance(args[0], (TracedFunction, TracedMethod, TensorMethod)) or
        callable(args[0]),
        b.abs: _abs, b.print: deferred.print_, b.super: _super, b.id: _id,
        b.int: _scalar(int), b.float: _scalar(float), b.bool: _scalar(bool), b.complex: _scalar(complex),
        torch.no_grad: _grad_mode(False), torch.enable_grad: _grad_mode(True),
        torch.set_grad_enabled: _set_grad_enabled, torch.inference_mode: _grad_mode(False),
        contextlib.nullcontext: _nullcontext,
        torch._C.DisableTorchFunctionSubclass: _no_graph_effect(torch._C.DisableTorchFunctionSubclass),
        torch._C.DisableTorchFunction: _no_graph_effect(torch._C.DisableTorchFunction),
        torch.autograd.profiler.record_function: _no_graph_effect(torch.autograd.profiler.record_function),
        torch.autocast: _autocast, torch.amp.autocast: _autocast,
        torch._C._get_tracing_state: _constant(None),
        torch._C._set_grad_enabled: lambda frame, args, kwargs: set_grad_mode(frame, bool(args[0])),
        torch.jit.is_scripting: _constant(False), torch.jit.is_tracing: _constant(False),
        warnings.warn: deferred.warn_, torch.manual_seed: deferred.manual_seed_,
        torch.random.manual_seed: deferred.manual_seed_,
    })
    for kind in ("parameters", "named_parameters", "buffers", "named_buffers", "children",
                 "named_children", "modules", "named_modules"):
        SPECIAL[getattr(torch.nn.Module, kind)] = _module_members(kind)
    SPECIAL[functools.wraps] = _wraps
    from .checkpoint import activation_checkpoint  # torch.utils.checkpoint: traced as a region

    SPECIAL[getattr(torch_checkpoint.checkpoint, "__wrapped__", torch_checkpoint.checkpoint)] = activation_checkpoint
    SPECIAL[math.sqrt] = _sym_math(math.sqrt, torch.sym_sqrt)
    for text_fn in (str, repr):
        SPECIAL[text_fn] = _text(text_fn)
    SPECIAL[functools.partial] = lambda frame, args, kwargs: cast(Any, functools.partial)(*args, **kwargs)
    SPECIAL[functools.reduce] = lambda frame, args, kwargs: frame.call(polyfills.reduce_, list(args), kwargs)
    cond = getattr(torch, "cond", None)
    if cond is not None:
        from .cond import trace_cond

        SPECIAL[cond] = trace_cond
    compiler_ns = vars(torch).get("compiler")  # user code asks it whether it is being compiled
    for name in ("is_compiling", "is_dynamo_compiling"):
        fn = getattr(compiler_ns, name, None)
        if fn is not None:
            SPECIAL[fn] = _constant(True)
    for name in ("is_exporting",):
        fn = getattr(compiler_ns, name, None)
        if fn is not None:
            SPECIAL[fn] = _constant(False)
    SPECIAL[controls.is_compiling] = _constant(True)
    for fn in (controls.set_stance, getattr(compiler_ns, "set_stance", None)):
        if fn is not None:
            SPECIAL[fn] = _refuse("set_stance inside compiled code",
                                  "set the stance around the call of the compiled function")
    if hasattr(torch._utils, "is_compiling"):
        SPECIAL[torch._utils.is_compiling] = _constant(True)
    # builtins that read the calling frame: a real call would read kiln's interpreter, not the user's
    SPECIAL[builtins.locals] = _locals
    SPECIAL[builtins.vars] = _vars
    SPECIAL[builtins.dir] = _dir
    SPECIAL[builtins.globals] = _frame_object("globals()")  # what is read through the dict is not guarded
    frame_readers: list[tuple[Any, str]] = [(sys._getframe, "sys._getframe"),
                                            (inspect.currentframe, "inspect.currentframe"),
                                            (inspect.stack, "inspect.stack"), (inspect.trace, "inspect.trace"),
                                            (traceback.extract_stack, "traceback.extract_stack"),
                                            (traceback.format_stack, "traceback.format_stack"),
                                            (traceback.print_stack, "traceback.print_stack"),
                                            (traceback.walk_stack, "traceback.walk_stack")]
    for name in ("_getframemodulename",):
        if hasattr(sys, name):
            frame_readers.append((getattr(sys, name), f"sys.{name}"))
    for fn, what in frame_readers:
        SPECIAL[fn] = _frame_object(what)


_register()
_register_operators()
