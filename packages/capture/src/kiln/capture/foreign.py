"""Objects whose state the trace cannot see: what a capture may and may not compute on at trace time.

Note: a value read from the frame is either a graph input (tensors, symbolic ints) or guarded
(constants by value, containers item by item, functions and modules by identity). An object of a
class implemented in C (a numpy array, a set, a deque, a ``random.Random``) is guarded by its type
only: its contents are not part of any guard. Computing on it at trace time (``len(dq)``,
``arr.sum()``, ``rng.random()``, ``3 in s``) would bake one call's contents into the cache entry and
return them on every later call. So those objects are *opaque* to the trace: reading their
attributes goes through guarded sources, but any computation on them breaks the graph and runs in
Python (``refuse_opaque``), where each call sees its own data.
"""

from __future__ import annotations

import array
import collections
import enum
import io
import random
import sys
import types
from typing import Any

import torch

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (class statements, some C types)
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: static types and most C extension types


def numpy_or_none() -> Any:
    """numpy if it has been imported (a numpy value cannot exist otherwise)."""
    return sys.modules.get("numpy")


def is_ndarray(v: Any) -> bool:
    np = numpy_or_none()
    return np is not None and isinstance(v, np.ndarray)


def is_numpy_scalar(v: Any) -> bool:
    np = numpy_or_none()
    return np is not None and isinstance(v, np.generic)


def state_in_c(value: Any) -> bool:
    """Whether ``value``'s state lives outside its ``__dict__`` (a class implemented in C, or a
    Python class deriving from one): attribute guards cannot describe it."""
    return any(_c_class(klass) for klass in type(value).__mro__[:-1])


def _c_class(klass: type) -> bool:
    if not klass.__flags__ & _HEAPTYPE or klass.__flags__ & _IMMUTABLETYPE:
        return True
    module = sys.modules.get(klass.__module__)  # a heap type of an extension module (_random.Random)
    path = getattr(module, "__file__", None)
    return module is not None and module.__name__ != "__main__" and not (path or "").endswith(".py")


# immutable values a cache entry may hold as constants (everything else is rebuilt per call)
_IMMUTABLE = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented),
              range, slice, frozenset, enum.Enum, torch.dtype, torch.device, torch.layout,
              torch.memory_format, torch.Size, torch.finfo, torch.iinfo, types.ModuleType, type,
              types.FunctionType, types.BuiltinFunctionType, types.CodeType)


def is_immutable_constant(v: Any) -> bool:
    """A value that is the same on every call once its identity is fixed (a cache entry may hold it)."""
    if isinstance(v, types.BuiltinFunctionType):  # a builtin bound to an object carries its state
        owner = getattr(v, "__self__", None)
        return owner is None or isinstance(owner, (types.ModuleType, type))
    if is_numpy_scalar(v):
        return True
    if isinstance(v, frozenset):
        return all(is_immutable_constant(x) for x in v)
    return isinstance(v, _IMMUTABLE)


_MUTABLE_C = (collections.deque, bytearray, array.array, random.Random, io.IOBase, set)


def is_mutable_c_value(v: Any) -> bool:
    """A mutable object of a C type a real call returned (rebuilding it per call is not possible)."""
    return is_ndarray(v) or isinstance(v, _MUTABLE_C)
