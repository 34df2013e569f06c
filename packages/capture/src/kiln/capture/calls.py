"""Calling things inside the trace: torch ops are recorded, Python code is inlined, the rest of
Python runs for real when it cannot touch tensors, and anything else breaks the graph."""

from __future__ import annotations

import builtins
import collections
import datetime
import enum
import functools
import inspect
import itertools
import operator
import os
import sys
import time
import types
import weakref
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from . import numpy_random, polyfills, torch_ops
from .builtins_impl import SPECIAL
from .controls import (
    allowed_in_graph,
    disabled_reason,
    dynamo_patched_original,
    torch_disabled_wrapper,
)
from .deferred import defer, is_log_call
from .errors import GraphBreak
from .foreign import is_immutable_constant, is_mutable_c_value
from .generators import GeneratorMethod, is_lazy, lazy_polyfill, make_generator
from .knobs import user_environment
from .module_calls import backward_hooks_reason, runs_in_python
from .module_init import build_module, grad_leaf_call, make_parameter, mark_built_state, site_of
from .numpy_random import is_python_draw, rng_call
from .numpy_table import BoundArrayMethod, call_array_method, constant_ufunc_call, numpy_handler
from .semantics import (
    check_tracked,
    concrete_key,
    contains_traced,
    is_traced,
    lookup_static,
    refuse_foreign_values,
)
from .sources import attr_source, item_source
from .values import (
    EMPTY,
    NULL,
    Cell,
    InterpIterator,
    NumpyArray,
    TensorMethod,
    TracedFunction,
    TracedMethod,
)

if TYPE_CHECKING:
    from .frame import Frame

_MODULE_CALLS = {nn.Module.__call__, nn.Module._call_impl}
if hasattr(nn.Module, "_wrapped_call_impl"):
    _MODULE_CALLS.add(nn.Module._wrapped_call_impl)

# Python code run for real (not inlined) when no tensor is involved: the stdlib and typing helpers.
_REAL_MODULE_PREFIXES = ("typing", "inspect", "enum", "abc", "functools", "collections", "dataclasses",
                         "copy", "warnings", "logging", "re", "os", "posixpath", "threading",
                         "contextlib", "importlib", "packaging", "weakref")


def _refuse_input_flag_change(frame: Frame, t: Any, flag: Any) -> None:
    """``requires_grad_()`` that changes a tensor from outside the compiled code: its flag, and the
    ``.grad`` a later backward gives it, are the caller's (the graph's copy of the flag never reached
    the caller's tensor, whose gradient then stayed None): the call runs in Python."""
    source = frame.tracer.input_source_of_fake.get(id(t))
    if source is not None and isinstance(flag, bool) and flag != t.requires_grad:
        raise GraphBreak(f"requires_grad_({flag}) on {source}, a tensor from outside the compiled code",
                         "its flag and gradient are the caller's; set requires_grad before the call")


def call_function(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    if fn is NULL:
        raise GraphBreak("calling NULL (interpreter stack mismatch)")
    if isinstance(fn, TensorMethod):
        if fn.name == "requires_grad_":
            _refuse_input_flag_change(frame, fn.tensor, args[0] if args else kwargs.get("requires_grad", True))
        return grad_leaf_call(frame, f"Tensor.{fn.name}",
                              lambda: torch_ops.tensor_method(frame, fn.tensor, fn.name, args, kwargs))
    if isinstance(fn, TracedFunction):
        return inline(frame, fn.code, fn.globals, args, kwargs, fn.defaults, fn.kwdefaults, fn.closure, fn)
    if isinstance(fn, GeneratorMethod):
        return fn.call(list(args), kwargs)
    if isinstance(fn, TracedMethod):
        return call_function(frame, fn.fn, [fn.self_obj, *args], kwargs)
    if fn is builtins.__build_class__:
        return build_class(frame, args, kwargs)
    poly = lazy_polyfill(fn, args, kwargs)
    if poly is not None:
        return call_function(frame, poly, list(args), kwargs)
    special = _special(fn)
    if special is not None:
        return special(frame, args, kwargs)
    if isinstance(fn, BoundArrayMethod):
        return call_array_method(frame, fn, args, kwargs)
    if rng_call(fn) is not None:  # NumPy's generators: draws before the graph (numpy_random.py)
        return numpy_random.call(frame, fn, list(args), dict(kwargs))
    numpy_fn = numpy_handler(fn)
    if numpy_fn is not None and any(is_python_draw(a) for a in [*args, *kwargs.values()]):
        raise GraphBreak(f"numpy.{getattr(fn, '__name__', fn)} of a number drawn by numpy random",
                         "it runs in Python on the drawn value")
    if numpy_fn is not None and not constant_ufunc_call(fn, args, kwargs):  # np.* as tensor code
        return numpy_fn(frame, list(args), dict(kwargs))
    if isinstance(fn, (types.FunctionType, types.MethodType)):
        original = dynamo_patched_original(fn)
        if original is not None:  # torch.compile's own mark on torch.optim internals: traced as before it
            return call_function(frame, original, list(args), kwargs)
        reason = disabled_reason(fn)
        if reason is not None:
            raise GraphBreak(f"call to {getattr(fn, '__qualname__', fn)}, {reason}",
                             "it runs in Python outside the graph, its frames not captured")
    if allowed_in_graph(fn):  # kiln/torch.compiler.allow_in_graph: one node, run on fake tensors
        return frame.tracer.record("call_function", fn, tuple(args), dict(kwargs), lambda: fn(*args, **kwargs))
    if isinstance(fn, types.MethodType):
        if fn.__func__ is torch.autocast.__exit__:
            raise GraphBreak("leaving a torch.autocast block entered before a graph break",
                             "the block's end runs in Python; the code after it is captured again")
        if fn.__func__ in _MODULE_CALLS and isinstance(fn.__self__, nn.Module):
            return call_module(frame, fn.__self__, args, kwargs)
        if isinstance(fn.__func__, types.BuiltinFunctionType) and is_opaque_object(fn.__self__) and \
                (type(fn.__self__).__name__, fn.__func__.__name__) not in _PURE_QUERIES:
            raise _opaque_break(fn.__self__, fn.__func__)  # a pybind11 method (process group, reducer)
        return call_function(frame, fn.__func__, [fn.__self__, *args], kwargs)
    if isinstance(fn, functools.partial):
        src = frame.tracer.source_of.get(id(fn))
        if src is not None:  # the caller's partial: its function, arguments and keywords are guarded
            func, pargs, keywords = (frame.tracer.wrap(getattr(fn, a), attr_source(src, a))
                                     for a in ("func", "args", "keywords"))
            return call_function(frame, func, [*pargs, *args], {**keywords, **kwargs})
        return call_function(frame, fn.func, [*fn.args, *args], {**fn.keywords, **kwargs})
    if isinstance(fn, (operator.attrgetter, operator.itemgetter, operator.methodcaller)):
        return _call_getter(frame, fn, args)
    if fn in _MODULE_CALLS and args and isinstance(args[0], nn.Module):
        return call_module(frame, args[0], args[1:], kwargs)
    if isinstance(fn, nn.Module):
        return call_module(frame, fn, args, kwargs)
    if torch_ops.is_torch_function(fn):
        _refuse_per_call_value(fn)
        return grad_leaf_call(frame, f"torch.{getattr(fn, '__name__', fn)}",
                              lambda: torch_ops.call_torch(frame, fn, args, kwargs))
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):  # not functional_op
        raise GraphBreak(f"torch.ops.{fn} is not recorded: it writes its arguments, returns an alias of one, "
                         "or is a packet of several overloads", "call one overload (op.default), or accept the break")
    if isinstance(fn, type):
        return construct(frame, fn, args, kwargs)
    if isinstance(fn, types.FunctionType):
        if fn is nn.Module.__init__ and args and id(args[0]) in frame.tracer.made:  # super().__init__()
            return real_call(frame, fn, args, kwargs)  # of a module built in the trace: its empty tables
        if is_log_call(fn):  # logging: replayed after the graph (deferred.py)
            return defer(frame, fn, args, kwargs)
        if _run_for_real(frame, fn, args, kwargs):
            return real_call(frame, fn, args, kwargs)
        return inline_function(frame, fn, args, kwargs)
    if isinstance(fn, types.BuiltinMethodType) and type(fn.__self__) is list and fn.__name__ == "sort":
        return frame.call(polyfills.list_sort_, [fn.__self__, *args], kwargs)  # key= may be traced
    if isinstance(fn, types.MethodWrapperType) and fn.__name__ == "__get__" and \
            isinstance(fn.__self__, types.FunctionType) and args and args[0] is not None:
        # func.__get__(obj, cls): binding a Python function (an lr scheduler's wrapper of optimizer.step)
        # reads nothing from obj; the bound method is inlined when called
        return types.MethodType(fn.__self__, args[0])
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                       types.WrapperDescriptorType, types.MethodDescriptorType,
                       types.ClassMethodDescriptorType)):
        _refuse_per_call_value(fn)
        if args and isinstance(getattr(fn, "__self__", None), (dict, set, frozenset)) and fn.__name__ in _KEYED:
            args = [concrete_key(args[0]), *args[1:]]  # seen.add(n), cache.get(n): a symbolic key hashes as its value
        return real_call(frame, fn, args, kwargs)
    if isinstance(fn, weakref.ReferenceType) and not args and not kwargs:
        src = frame.tracer.source_of.get(id(fn))
        if src is not None:  # the caller's weak reference (an RNN's to its weights): what it refers to now,
            return frame.tracer.wrap(fn(), f"{src}()")  # read and guarded through it
    call = getattr(type(fn), "__call__", None)  # noqa: B004 (the type's __call__, to inline it)
    if isinstance(call, types.FunctionType):
        return call_function(frame, call, [fn, *args], kwargs)
    return real_call(frame, fn, args, kwargs)


# lazy itertools that call a function (operator.add by default) on the items from C
_CALLS_FROM_C = frozenset({itertools.accumulate, itertools.starmap, itertools.filterfalse, itertools.takewhile,
                           itertools.dropwhile, itertools.groupby})

def _no_tensors(v: Any) -> bool:
    """Plain numbers, strings, functions, and lists/tuples/ranges of them (not an iterator, which may
    yield tensors)."""
    if isinstance(v, (list, tuple)):
        return all(_no_tensors(x) for x in v)
    return isinstance(v, (int, float, str, bool, range, type(None))) or callable(v) and not is_traced(v)


# methods of dicts and sets whose first argument is a key
_KEYED = frozenset({"get", "setdefault", "pop", "add", "discard", "remove", "__contains__", "__getitem__",
                    "__setitem__", "__delitem__", "fromkeys"})


def _call_getter(frame: Frame, fn: Any, args: list) -> Any:
    """operator.attrgetter/itemgetter/methodcaller through the traced getattr/getitem/call."""
    from .builtins_impl import SPECIAL as _S  # the getattr handler, with guards on what it reads

    (obj,) = args
    ctor, params = fn.__reduce__()[:2]
    src = frame.tracer.source_of.get(id(fn))
    if src is not None:  # the caller's getter: what it names (and a methodcaller's arguments) is guarded
        wrap, state = frame.tracer.wrap, f"{src}.__reduce__()"
        params = wrap(params, item_source(state, 1))
        if isinstance(ctor, functools.partial):
            ctor = functools.partial(wrap(ctor.func, attr_source(item_source(state, 0), "func")),
                                     *wrap(ctor.args, attr_source(item_source(state, 0), "args")),
                                     **wrap(ctor.keywords, attr_source(item_source(state, 0), "keywords")))
    if isinstance(fn, operator.methodcaller):  # (methodcaller, (name, *args)) or (partial(..), args)
        if isinstance(ctor, functools.partial):
            name, call_args, call_kwargs = ctor.args[0], list(params), dict(ctor.keywords)
        else:
            name, call_args, call_kwargs = params[0], list(params[1:]), {}
        method = _S[getattr](frame, [obj, name], {})
        return call_function(frame, method, call_args, call_kwargs)
    results = []
    for p in params:
        if isinstance(fn, operator.itemgetter):
            results.append(_S[operator.getitem](frame, [obj, p], {}))
            continue
        value = obj
        for part in p.split("."):
            value = _S[getattr](frame, [value, part], {})
        results.append(value)
    return results[0] if len(results) == 1 else tuple(results)


def _special(fn: Any) -> Any:
    try:
        found = SPECIAL.get(fn)
    except TypeError:  # unhashable callable
        return None
    if found is None and torch_disabled_wrapper(fn):  # torch wraps some functions (torch.manual_seed) as never-compiled
        return SPECIAL.get(fn.__wrapped__)
    return found


def _run_for_real(frame: Frame, fn: types.FunctionType, args: list, kwargs: dict) -> bool:
    mod = fn.__module__ or ""
    if not mod.startswith(_REAL_MODULE_PREFIXES):
        return False
    values = [*args, *kwargs.values()]
    # a library function given an object from the frame reads its state (copy.deepcopy(config),
    # dataclasses.asdict): run for real only once that whole state is guarded, else inlined so
    # what it reads is guarded (or breaks where it cannot be)
    if mod == "copy" and any(_holds_module_state(a) for a in values):  # copy.deepcopy(self.fc): run for
        # real, it bakes the capture's tensors into the entry; inlining the copy protocol is no better
        raise GraphBreak(f"{mod}.{fn.__name__}() of a module holding parameters or buffers",
                         "it runs in Python on every call")
    if _calls_user_code([*_closure_values(fn), *values]):
        return False
    return not any(contains_traced(a) for a in values) and \
        all(_guard_whole_state(frame, a) for a in values if _unguarded_state(frame, a))


def _closure_values(fn: types.FunctionType) -> list[Any]:
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return out


def _calls_user_code(values: list[Any], depth: int = 0) -> bool:
    """Whether a library function given ``values`` could call the user's Python code (a generator
    function behind ``contextlib.contextmanager``, the generator it made): run for real, that code
    ran once at capture, its side effects missing from every later call and its values constants."""
    for v in values:
        if isinstance(v, types.MethodType):
            v = v.__func__
        if isinstance(v, (TracedFunction, TracedMethod, InterpIterator)):
            return True
        if isinstance(v, types.FunctionType) and not (v.__module__ or "").startswith(_REAL_MODULE_PREFIXES) \
                and not (v.__module__ or "").startswith(("torch", "kiln")):
            return True
        if depth >= 2:
            continue
        if type(v) in (list, tuple) and _calls_user_code(list(v), depth + 1):
            return True
        if type(v) is dict and _calls_user_code(list(v.values()), depth + 1):
            return True
        if type(v).__module__.startswith(_REAL_MODULE_PREFIXES) and isinstance(getattr(v, "__dict__", None), dict) \
                and _calls_user_code(list(vars(v).values()), depth + 1):
            return True
    return False


def _holds_module_state(v: Any, depth: int = 0) -> bool:
    """A module with parameters or buffers, or a list/tuple/dict of them."""
    if isinstance(v, nn.Module):
        return any(True for _ in v.parameters()) or any(b is not None for b in v.buffers())
    if depth < 2 and type(v) in (list, tuple):
        return any(_holds_module_state(x, depth + 1) for x in v)
    if depth < 2 and type(v) is dict:
        return any(_holds_module_state(x, depth + 1) for x in v.values())
    return False


def _unguarded_state(frame: Frame, v: Any) -> bool:
    """An object from outside the compiled code (it has a guard source) whose attributes are its
    state and are guarded only where the trace reads them: a real call given it would read the rest
    unguarded and bake this call's values into the entry."""
    if id(v) not in frame.tracer.source_of or v is user_environment():  # guarded whole (tracer.wrap)
        return False
    if isinstance(v, (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                      nn.Module, torch.Tensor, enum.Enum, list, tuple, dict, set, frozenset)):
        return False
    return hasattr(v, "__dict__") and not is_immutable_constant(v)


def _guard_whole_state(frame: Frame, v: Any, depth: int = 0) -> bool:
    """Guard every attribute of ``v`` (nested plain objects too, a few levels deep), so a real call
    reading all of it sees what the guards pin; False when the state is too deep or not plain."""
    src = frame.tracer.source_of.get(id(v))
    if src is None or depth > 3 or any("__slots__" in vars(k) for k in type(v).__mro__[:-1]):
        return False
    d = vars(v)
    if not all(type(k) is str for k in d) or len(d) > 512:
        return False
    frame.tracer.add_guard(f"{src}.__dict__", "DICT_KEYS", tuple(d))
    for k, x in d.items():
        source = f"{src}.__dict__[{k!r}]"
        if _unguarded_state(frame, x) or not frame.tracer.source_of.get(id(x)) and hasattr(x, "__dict__") and \
                not isinstance(x, (type, types.ModuleType, types.FunctionType, nn.Module, torch.Tensor, enum.Enum)):
            frame.tracer.wrap(x, source)  # its type, and a source for the level below
            if not _guard_whole_state(frame, x, depth + 1):
                return False
        elif isinstance(x, torch.Tensor) or contains_traced(frame.tracer.wrap(x, source)):
            return False  # a tensor in the state: the real call would compute on it outside the graph
    return True


def real_call(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    """Run a callable for real; refuse when that would compute on tensors outside the graph."""
    self_obj = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", repr(fn))
    if is_opaque_method(fn, self_obj):
        raise _opaque_break(self_obj, fn)
    if self_obj is not None and not isinstance(self_obj, types.ModuleType) and \
            frame.tracer.source_of.get(id(self_obj)) is not None and name in _MUTATING:
        if frame.tracer.owns_copy(self_obj):  # an input list/dict: replayed after the graph
            frame.tracer.note_container_write(self_obj)
            return real_call_unchecked(frame, fn, args, kwargs)
        raise GraphBreak(f"{type(self_obj).__name__}.{name}() mutates an object from outside the "
                         "compiled code", "mutations of inputs run in Python")
    return real_call_unchecked(frame, fn, args, kwargs)


# C types whose methods only compute on their own value (no hidden state to replay).
_VALUE_TYPES: tuple[type, ...] = (list, tuple, dict, set, frozenset, str, bytes, bytearray, int, float, complex,
                                  bool, slice, range, memoryview, torch.Size, torch.dtype, torch.device,
                                  torch.finfo, torch.iinfo, torch.layout, torch.memory_format, torch.Tensor,
                                  enum.Enum, type, BaseException, collections.deque)
_PURE_QUERIES = frozenset({("ProcessGroup", "rank"), ("ProcessGroup", "size"), ("ProcessGroup", "name"),
                           ("ProcessGroup", "group_name"), ("ProcessGroup", "group_desc"),
                           ("DeviceMesh", "size")})


def is_opaque_method(fn: Any, self_obj: Any) -> bool:
    """A C method bound to an object of a C extension type (a generator, a work handle...)."""
    if not isinstance(fn, types.BuiltinMethodType):  # method-wrappers are object's own dunders
        return False
    return is_opaque_object(self_obj) and (type(self_obj).__name__, getattr(fn, "__name__", "")) not in _PURE_QUERIES


def is_opaque_object(obj: Any) -> bool:
    """An object of a C extension type (a pybind11 reducer, logger, process group, store...): calling
    its methods at capture time would run their effects once and bake their results in."""
    if obj is None or isinstance(obj, (types.ModuleType, *_VALUE_TYPES)):
        return False
    cls = type(obj)
    if cls.__name__.startswith("pybind11_detail_function_record"):  # a pybind11 free function
        return False
    return all(k.__module__ != "builtins" or k is object for k in cls.__mro__)


def _opaque_break(obj: Any, fn: Any) -> GraphBreak:
    name = getattr(fn, "__name__", "method")
    return GraphBreak(f"{type(obj).__qualname__}.{name}() is a method of an opaque (C extension) object: "
                      "it may read or change state a cached graph cannot replay", "it runs in Python on every call")


def real_call_unchecked(frame: Frame, fn: Any, args: list, kwargs: dict) -> Any:
    name = getattr(fn, "__name__", repr(fn))
    self_obj = getattr(fn, "__self__", None)
    if any(isinstance(a, (TracedFunction, TracedMethod)) for a in [*args, *kwargs.values()]):
        raise GraphBreak(f"passing a function defined in compiled code to {name}()")
    if not (isinstance(fn, types.BuiltinFunctionType) and fn in _TYPE_ONLY):
        refuse_foreign_values(frame, [self_obj, *args, *kwargs.values()], f"{name}()")
        if any(_unguarded_state(frame, a) and not _guard_whole_state(frame, a)
               for a in [self_obj, *args, *kwargs.values()]):
            raise GraphBreak(f"{name}() reads the state of an object from outside the compiled code",
                             "it runs in Python on every call")
    if any(isinstance(a, NumpyArray) for a in [self_obj, *args, *kwargs.values()]):
        raise GraphBreak(f"{getattr(fn, '__module__', None) or 'numpy'}.{name} is not traced on numpy arrays",
                         "it runs in Python between graphs")
    traced_args = any(contains_traced(a) for a in args) or any(contains_traced(v) for v in kwargs.values())
    if fn in _CALLS_FROM_C and not all(_no_tensors(a) for a in [*args, *kwargs.values()]):
        # its iterator would call add (or the given function) on fake tensors from C, unrecorded; the
        # break must come here: one found while iterating leaves the iterator consumed for the resume
        raise GraphBreak(f"itertools.{name}() over tensors (or an iterator) calls its function outside the trace",
                         "it runs in Python between graphs")
    lazy = [a for a in [*args, *kwargs.values()] if is_lazy(a)]
    if lazy and not traced_args:
        result = fn(*args, **kwargs)
        if hasattr(type(result), "__next__"):  # a lazy C wrapper (itertools...): it would advance the
            # generator later, outside the interpreter's order
            raise GraphBreak(f"{name}() over a generator made in compiled code", "the generator runs in Python")
    elif not traced_args:
        result = fn(*args, **kwargs)
    else:
        versions = _versions([*args, *kwargs.values()])
        try:
            result = fn(*args, **kwargs)
        except GraphBreak:
            raise
        except Exception as e:
            raise GraphBreak(f"{getattr(fn, '__qualname__', name)}() cannot run on tensors at capture "
                             f"time ({type(e).__name__})", "it runs in Python between graphs") from e
        if _versions([*args, *kwargs.values()]) != versions:  # the write happened to fake tensors only
            raise GraphBreak(f"{getattr(fn, '__qualname__', name)}() wrote a tensor in place outside the graph",
                             "it runs in Python between graphs")
    check_tracked(frame, result, f"{name}()")
    if is_mutable_c_value(result):
        frame.tracer.note_made(result)
    return result


def _versions(values: list) -> list[object]:
    """Version counters of the tensors in ``values`` (and one level of lists/tuples/dicts in them); an
    inference tensor's, which counts no writes, as a new object (never equal: a call given one breaks)."""
    out: list[object] = []
    for v in values:
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        out += [object() if t.is_inference() else t._version for t in items if isinstance(t, torch.Tensor)]
    return out


def _refuse_per_call_value(fn: Any) -> None:
    if _per_call_value(fn):
        bound = getattr(fn, "__self__", None)
        owner = getattr(fn, "__module__", None) or getattr(bound, "__name__", type(bound).__name__)
        raise GraphBreak(f"{owner}.{fn.__name__}() gives a new value on every call (a clock, the OS's randomness, "
                         "a seed)", "it runs in Python between graphs; pass its value in to keep one graph")


def _per_call_value(fn: Any) -> bool:
    """Whether ``fn`` is a C function whose result differs between calls with the same arguments (clocks,
    the OS's random bytes, a generator's seed): run once at capture, its value would be a constant of the
    graph (a ``time.time()`` inside compiled code returned the capture's time on every call)."""
    if isinstance(getattr(fn, "__self__", None), torch.Generator) and fn.__name__ in ("initial_seed", "seed"):
        return True  # the seed a manual_seed between calls changed (torch.initial_seed()), or a fresh one
    try:
        return fn in _PER_CALL_VALUES
    except TypeError:  # an unhashable callable
        return False


_PER_CALL_VALUES = frozenset(
    [getattr(time, n) for n in ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
                                "process_time", "process_time_ns", "thread_time", "thread_time_ns", "ctime",
                                "asctime", "localtime", "gmtime", "strftime") if hasattr(time, n)]
    + [getattr(os, n) for n in ("urandom", "getrandom", "times") if hasattr(os, n)]
    + [datetime.datetime.now, datetime.datetime.utcnow, datetime.datetime.today, datetime.date.today]
    + [torch.initial_seed, torch.seed])

_TYPE_ONLY = frozenset({callable, id, type, isinstance, issubclass, hasattr})  # read no object state
_MUTATING = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
                       "popitem", "add", "discard", "sort", "reverse", "__setitem__", "__delitem__",
                       "__setattr__", "__delattr__"})


def bind_arguments(code: types.CodeType, args: list, kwargs: dict, defaults: tuple,
                   kwdefaults: dict | None, name: str) -> dict[str, Any]:
    """CPython's argument binding for ``code`` (positional, keyword, *args, **kwargs, defaults)."""
    nargs, nkw, nposonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
    names = code.co_varnames
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: dict[str, Any] = {}
    pos = names[:nargs]
    for pname, a in zip(pos, args):
        bound[pname] = a
    extra = args[nargs:]
    if extra and not has_varargs:
        raise TypeError(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    kwonly = names[nargs:nargs + nkw]
    idx = nargs + nkw
    if has_varargs:
        bound[names[idx]] = tuple(extra)
        idx += 1
    rest: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in kwonly or (k in pos and pos.index(k) >= nposonly):
            if k in bound:
                raise TypeError(f"{name}() got multiple values for argument {k!r}")
            bound[k] = v
        elif has_varkw:
            rest[k] = v
        else:
            raise TypeError(f"{name}() got an unexpected keyword argument {k!r}")
    nd = len(defaults)
    for i, pname in enumerate(pos):
        if pname not in bound:
            j = i - (nargs - nd)
            if j < 0:
                raise TypeError(f"{name}() missing required positional argument {pname!r}")
            bound[pname] = defaults[j]
    for pname in kwonly:
        if pname not in bound:
            if kwdefaults and pname in kwdefaults:
                bound[pname] = kwdefaults[pname]
            else:
                raise TypeError(f"{name}() missing required keyword-only argument {pname!r}")
    if has_varkw:
        bound[names[idx]] = rest
    return bound


def inline_function(frame: Frame, fn: types.FunctionType, args: list, kwargs: dict) -> Any:
    src = frame.tracer.source_of.get(id(fn))
    closure: tuple[Cell, ...] = ()
    if fn.__closure__:
        closure = tuple(Cell(real=c, source=f"{src}.__closure__[{i}].cell_contents" if src else None)
                        for i, c in enumerate(fn.__closure__))
    defaults: tuple = fn.__defaults__ or ()
    kwdefaults: dict = fn.__kwdefaults__ or {}
    if src is not None:  # the guard is on the code object: defaults are guarded one by one
        defaults = tuple(frame.tracer.wrap(d, f"{src}.__defaults__[{i}]") for i, d in enumerate(defaults))
        kwdefaults = {k: frame.tracer.wrap(v, f"{src}.__kwdefaults__[{k!r}]") for k, v in kwdefaults.items()}
    return inline(frame, fn.__code__, fn.__globals__, args, kwargs, defaults, kwdefaults, closure, fn)


def inline(frame: Frame, code: types.CodeType, f_globals: dict, args: list, kwargs: dict,
           defaults: tuple, kwdefaults: dict, closure: tuple[Cell, ...], callee: Any = None) -> Any:
    """Run ``code`` as a call inside the trace; a generator function's call makes a generator of the
    trace whose body runs as it is advanced (generators.py); ``callee`` remakes it after the graph."""
    if frame.depth >= frame.ctx.depth_limit:
        raise GraphBreak(f"call depth over {frame.ctx.depth_limit} while inlining {code.co_name}")
    if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE):
        raise GraphBreak(f"coroutine {code.co_name}")
    bound = bind_arguments(code, args, kwargs, defaults, kwdefaults, code.co_name)
    child = frame.spawn(code, f_globals, bound, closure)
    if child.is_generator:
        return make_generator(frame, child, callee, args, kwargs)
    return child.run_inlined()


def call_module(frame: Frame, module: nn.Module, args: list, kwargs: dict) -> Any:
    python_reason = runs_in_python(module)
    if python_reason is not None:  # the call runs in Python at the break, its forward compiled
        raise GraphBreak(python_reason, "the module's forward is compiled as its own frame")
    reason = disabled_reason(module.__dict__.get("forward", type(module).forward))
    if reason is not None:
        raise GraphBreak(f"call to {type(module).__name__}.forward, {reason}",
                         "it runs in Python outside the graph, its frames not captured")
    _guard_call_path(frame, module)
    hooked = backward_hooks_reason(module)
    if hooked is not None:
        raise GraphBreak(hooked, "the call runs in Python, its hooks fire in the backward as in eager, its "
                                 "forward is compiled as its own frame")
    if _has_hooks(module):  # inlined itself: a call of _call_impl is a module call (call_function)
        return inline_function(frame, cast(types.FunctionType, nn.Module._call_impl), [module, *args], kwargs)
    forward = type(module).forward
    if "forward" in module.__dict__:
        return call_function(frame, module.__dict__["forward"], list(args), kwargs)
    if not isinstance(forward, types.FunctionType):
        raise GraphBreak(f"{type(module).__name__}.forward is not a Python function")
    return call_function(frame, forward, [module, *args], kwargs)


def _guard_call_path(frame: Frame, module: nn.Module) -> None:
    """What decides how ``module(...)`` is traced (its hooks, the global module hooks, which
    ``forward`` it has) is checked on every call of the entry (module_calls.call_path_check), so a
    hook registered after the capture runs and an instance ``forward`` set later is called."""
    tracer = frame.tracer
    tracer.note_global_hooks()
    src = tracer.source_of.get(id(module))
    if src is None:  # made by the compiled code itself: its hooks and forward are the code's
        return
    if not tracer.is_unspecialized(src):
        tracer.note_module_call(module)
        return
    for table in _HOOK_TABLES:  # a new object each call: read through its source
        if hasattr(module, table):
            tracer.add_guard(f"{src}.{table}", "LENGTH_MATCH", len(getattr(module, table)))
    code = getattr(module.forward, "__code__", None)
    if code is not None:
        tracer.guard_identity(f"{src}.forward.__code__", code)


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _has_hooks(m: nn.Module) -> bool:
    if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or \
            getattr(m, "_backward_pre_hooks", None):
        return True
    g = nn.modules.module
    return bool(g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks)


def construct(frame: Frame, cls: type, args: list, kwargs: dict) -> Any:
    """Calling a class: user classes are built with their __init__ inlined; C classes for real."""
    if issubclass(cls, nn.Module):
        return construct_module(frame, cls, args, kwargs)
    if cls is nn.Parameter:
        return make_parameter(frame, cls, args, kwargs)
    if issubclass(cls, torch.Tensor):
        raise GraphBreak(f"constructing {cls.__name__} inside compiled code")
    new = lookup_static(cls, "__new__")
    init = lookup_static(cls, "__init__")
    py_new = isinstance(new, staticmethod) and isinstance(new.__func__, types.FunctionType)
    py_init = isinstance(init, types.FunctionType)
    if cls.__module__ == "builtins" or issubclass(cls, (BaseException, enum.Enum)) or not (py_new or py_init) or \
            (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return real_call(frame, cls, args, kwargs)
    if py_new:
        obj = call_function(frame, new.__func__, [cls, *args], kwargs)
    else:
        obj = cls.__new__(cls)
    if not isinstance(obj, cls):
        return obj
    frame.tracer.note_made(obj)
    if py_init:
        call_function(frame, init, [obj, *args], kwargs)
    elif init is not None and init is not object.__init__:
        init(obj, *args, **kwargs)
    return obj


def construct_module(frame: Frame, cls: type, args: list, kwargs: dict) -> nn.Module:
    """``nn.CrossEntropyLoss()`` or ``nn.Linear(8, 4)`` in a forward: a torch.nn module is built for
    real once per capture, on fake tensors, its initialisation (random weights included) recorded as
    graph work (module_init.py); one without state is rebuilt per call if it outlives the graph.
    Modules of other libraries and the user's own run their ``__init__`` in Python (a break)."""
    name = cls.__name__
    if not (cls.__module__ or "").startswith("torch."):
        return construct_user_module(frame, cls, args, kwargs)
    # a symbolic size as a layer's width (``nn.Linear(x.shape[-1], 4)``): specialised, a shape guard
    args = [int(a) if isinstance(a, torch.SymInt) else a for a in args]
    kwargs = {k: int(v) if isinstance(v, torch.SymInt) else v for k, v in kwargs.items()}
    if not (cls.__module__ or "").startswith("torch.nn.") or \
            any(contains_traced(a) for a in args) or any(contains_traced(v) for v in kwargs.values()):
        raise GraphBreak(f"constructing module {name} inside compiled code",
                         "build the module outside the compiled function")
    refuse_foreign_values(frame, [*args, *kwargs.values()], f"{name}()")
    module = build_module(frame, cls, args, kwargs)
    frame.tracer.note_made(module)
    return module


def construct_user_module(frame: Frame, cls: type, args: list, kwargs: dict) -> nn.Module:
    """``Block(16)`` in a forward: a user module class built in the trace. Its ``__init__`` is inlined
    (so what it reads is guarded and its tensor work is graph work, random initialisation in eager's
    order); ``nn.Module.__init__``, attribute writes through ``nn.Module.__setattr__`` and the torch.nn
    submodules it builds (module_init.py) run for real on the new object, which exists only in the
    trace. One that outlives the graph is built in Python instead (``BuiltModuleEscapes``)."""
    site = site_of(frame)
    if site in frame.ctx.escaping_builds:
        raise GraphBreak(f"constructing module {cls.__name__} inside compiled code: the module outlives the "
                         "graph (returned, stored, or live at a graph break) and needs real nn.Parameters",
                         "it is built in Python on every call; build it outside the compiled function to "
                         "keep one graph")
    if lookup_static(cls, "__new__") is not object.__new__:
        raise GraphBreak(f"constructing module {cls.__name__} inside compiled code: it defines __new__",
                         "build the module outside the compiled function")
    obj = cast(nn.Module, object.__new__(cls))
    frame.tracer.note_made(obj)
    before = len(frame.tracer.built_state)
    call_function(frame, lookup_static(cls, "__init__"), [obj, *args], kwargs)
    mark_built_state(frame, obj, site, before)
    return obj


def build_class(frame: Frame, args: list, kwargs: dict) -> type:
    """A ``class`` statement inside compiled code: the body runs for real (it only defines names),
    as a real function whose closure cells hold the enclosing frame's current values."""
    body, name, *bases = args
    if not isinstance(body, TracedFunction) or any(contains_traced(b) for b in bases):
        raise GraphBreak(f"class {name} with computed bases or body")
    cells = []
    for c in body.closure:
        if c.real is not None:
            cells.append(c.real)
            continue
        if contains_traced(c.value):
            raise GraphBreak(f"class {name} body refers to a tensor of the compiled code",
                             "define the class outside the compiled function")
        cells.append(types.CellType() if c.value is EMPTY else types.CellType(c.value))
    real_body = types.FunctionType(body.code, body.globals, body.name, body.defaults or None, tuple(cells))
    return builtins.__build_class__(real_body, name, *bases, **kwargs)


def module_of(fn: Any) -> str:
    return cast(str, getattr(fn, "__module__", None) or getattr(sys.modules.get("builtins"), "__name__", ""))
