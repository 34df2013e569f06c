"""Interpreter-side values that stand in for things the real interpreter would hold.

Most values on the symbolic stack are real Python objects: constants, modules, lists and dicts
built during the trace, and FakeTensors standing for graph values. The classes here cover what
has no faithful real counterpart during a trace.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch


class _Null:
    """The NULL the CPython stack holds below a callable (PUSH_NULL, LOAD_GLOBAL with the low bit)."""

    _inst: _Null | None = None

    def __new__(cls) -> _Null:
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


class _Empty:
    def __repr__(self) -> str:
        return "<empty cell>"


EMPTY = _Empty()


@dataclass(eq=False)
class Cell:
    """A closure cell of an interpreted frame. ``real`` is set for cells of real function objects."""

    value: Any = EMPTY
    real: types.CellType | None = None
    source: str | None = None  # guard source of the real cell's contents


@dataclass(eq=False)
class TracedFunction:
    """A function made by MAKE_FUNCTION during the trace (nested defs, lambdas, comprehensions)."""

    code: types.CodeType
    globals: dict[str, Any]
    name: str
    defaults: tuple = ()
    kwdefaults: dict[str, Any] = field(default_factory=dict)
    closure: tuple[Cell, ...] = ()
    annotations: Any = None
    qualname: str = ""

    @property
    def __name__(self) -> str:
        return self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("internal: a traced function was called outside the interpreter")


@dataclass(eq=False)
class TracedMethod:
    """A TracedFunction bound to an object (a nested function stored on an object and called)."""

    fn: Any
    self_obj: Any


@dataclass(eq=False)
class TensorMethod:
    """``fake.name`` where name is a torch.Tensor method; calling it records a call_method node."""

    tensor: torch.Tensor
    name: str


@dataclass(eq=False)
class GradModeContext:
    """A grad-mode context manager object seen in the trace (no_grad, enable_grad, set_grad_enabled)."""

    enabled: bool
    prev: bool | None = None

    def make_real(self) -> Any:
        return torch.set_grad_enabled(self.enabled)


@dataclass(eq=False)
class AutocastContext:
    """A torch.autocast block in the trace: entered for real (fake tensors see it) and recorded."""

    device_type: str
    dtype: Any
    enabled: bool
    cache_enabled: Any = None
    real: Any = None
    node: Any = None


@dataclass(eq=False)
class ResumedAutocast:
    """A torch.autocast block entered in Python before a graph break, whose end a resume function's
    trace reaches: the rest of the graph runs in the state from before the block (``prev_*``, guarded)
    and the real block's ``__exit__`` (read from ``source``) runs after the graph."""

    device_type: str
    prev_dtype: Any
    prev_enabled: bool
    prev_cache_enabled: bool
    source: str


@dataclass(eq=False)
class NullContext:
    """A context manager with no effect on the graph (contextlib.nullcontext and friends)."""

    real: Any

    def make_real(self) -> Any:
        return self.real


@dataclass(eq=False)
class ContextExit:
    """The bound ``__exit__`` BEFORE_WITH leaves on the stack, for a context we model."""

    ctx: Any


class InterpIterator:
    """An iterator of the trace: ``next()`` raises StopIteration at its end, ``remaining()`` drains it."""

    def next(self) -> Any:
        raise NotImplementedError

    def remaining(self) -> list:
        out = []
        while True:
            try:
                out.append(self.next())
            except StopIteration:
                return out

    def __iter__(self) -> Any:  # so real Python calls (list.extend, str.join) can consume it
        while True:
            try:
                v = self.next()
            except StopIteration:
                return
            yield v


@dataclass(eq=False)
class ListIterator(InterpIterator):
    """An iterator over a list of interpreted values (lists, tuples, dict keys, ranges, zips).

    ``advances`` is its capture's log (``Tracer.advances``): (iterator, index before) per ``next``,
    so rolling back an instruction can undo what it advanced."""

    items: list
    advances: list[tuple[ListIterator, int]]
    index: int = 0

    def next(self) -> Any:
        if self.index >= len(self.items):
            raise StopIteration
        v = self.items[self.index]
        self.advances.append((self, self.index))
        self.index += 1
        return v

    def remaining(self) -> list:
        return self.items[self.index:]


@dataclass(eq=False)
class SuperProxy:
    """``super()`` / ``super(cls, obj)`` inside the trace: attribute lookups start after ``cls``."""

    cls: type
    obj: Any


@dataclass(eq=False)
class ExceptionValue:
    """An exception raised and being handled inside the trace."""

    exc: BaseException


class ResumeIterator:
    """A real iterator over a list that can be inspected without consuming it.

    Graph breaks inside loops hand the loop's iterator to the resume function as one of these, so
    the resume function's capture can guard on and read the remaining items.
    """

    __slots__ = ("items", "pos")

    def __init__(self, items: list) -> None:
        self.items = items
        self.pos = 0

    def __iter__(self) -> ResumeIterator:
        return self

    def __next__(self) -> Any:
        if self.pos >= len(self.items):
            raise StopIteration
        v = self.items[self.pos]
        self.pos += 1
        return v

    def __len__(self) -> int:
        return len(self.items) - self.pos

    def peek(self, i: int) -> Any:
        return self.items[self.pos + i]


@dataclass(eq=False)
class NumpyArray:
    """A NumPy array in the trace (numpy_trace.py): a fake tensor computed with NumPy's semantics.

    ``scalar`` marks a NumPy scalar (``np.float64``: a full reduction, an element), rebuilt as one.
    ``source`` is the guard source of an array read from the frame, so returning it unchanged
    returns the very object. ``python`` marks a Python ``float``/``int``/``bool`` a NumPy random
    draw returned (``np.random.rand()``), held as a 0-d float64/int64/bool tensor: only operators
    use it (numpy_random.python_operator), and it leaves the graph as that Python type."""

    t: torch.Tensor
    scalar: bool = False
    source: str | None = None
    python: type | None = None
