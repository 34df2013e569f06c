"""Symbolic sizes in graphs: the nodes computing a size expression, and a size expression as Python.

Note (the symbolic-graph contract between kiln.autograd and the compilers it calls): when a graph
was captured with symbolic sizes, every ATen graph kiln.autograd hands to a compiler callback
(``compiler(gm, example_inputs)``: forward, backward and inference graphs alike) satisfies:

- every placeholder's ``meta["val"]`` is a FakeTensor (or a SymInt); all their symbolic sizes come
  from ONE ShapeEnv, the one kiln.capture created for this capture (``val.fake_mode.shape_env``);
- a symbolic scalar input (a Python int argument made symbolic, or a size the forward saved for the
  backward) is a placeholder whose ``meta["val"]`` is a ``torch.SymInt``, whose expression is a
  plain symbol for an int argument and any size expression for a saved size;
- ``example_inputs`` are exactly those placeholder values (fake tensors and SymInts), in order;
- a size an op needs (``view``'s shape, ``expand``, ``new_zeros``...) is a node: ``aten.sym_size.int(x, d)``
  of a placeholder for a symbol, and ``operator.add/mul/floordiv/mod/pow``, ``torch.sym_max``/
  ``sym_min`` over those for an expression (``SymbolNodes``); every such node's ``meta["val"]`` is
  the SymInt it computes;
- at run time the compiled callable receives real tensors and plain Python ints in the same
  positions, and returns real tensors (and plain ints for sizes the forward saves).
Any assumption the tracing made about a size (``s0 >= 2``, ``s0 == s1``) is a guard in that
ShapeEnv; kiln.capture turns the ShapeEnv's guards into the entry's guards *after* the backend
returned, so a compiler may add guards too (``shape_env.evaluate_expr``), at the cost of fewer sizes
served by the compiled graph.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._meta_registrations as torch_meta  # its pooling size helper, swapped while tracing (Note below)
from torch import fx
from torch._dispatch.python import enable_python_dispatcher

_REL = {"Equality": "==", "Unequality": "!=", "StrictLessThan": "<", "LessThan": "<=",
        "StrictGreaterThan": ">", "GreaterThan": ">="}


class SymbolicSizeError(ValueError):
    """A size expression kiln cannot compute in a graph or print as Python."""


def py_expr(e: Any) -> str:
    """A sympy boolean/integer size expression as Python (evaluated without sympy)."""
    name = type(e).__name__
    if getattr(e, "is_Symbol", False):
        return str(e)
    if getattr(e, "is_Integer", False):
        return str(int(e))
    if getattr(e, "is_Rational", False):
        return f"({e.p}/{e.q})"
    if getattr(e, "is_Float", False):
        return repr(float(e))
    if name == "BooleanTrue":
        return "True"
    if name == "BooleanFalse":
        return "False"
    args = [py_expr(a) for a in e.args]
    if name in _REL:
        return f"({args[0]} {_REL[name]} {args[1]})"
    joined = {"Add": " + ", "Mul": " * ", "And": " and ", "Or": " or "}
    if name in joined:
        return "(" + joined[name].join(args) + ")"
    if name == "Pow":
        return f"({args[0]} ** {args[1]})"
    if name == "Not":
        return f"(not {args[0]})"
    if name == "FloorDiv":
        return f"({args[0]} // {args[1]})"
    if name in ("IntTrueDiv", "FloatTrueDiv"):
        return f"({args[0]} / {args[1]})"
    if name in ("PowByNatural", "FloatPow"):
        return f"({args[0]} ** {args[1]})"
    if name == "ToFloat":
        return f"float({args[0]})"
    if name == "OpaqueUnaryFn_sqrt":  # the correctly rounded root Python computed (``** 0.5`` need not be);
        return f"__import__('math').sqrt({args[0]})"  # guards are evaluated with empty globals
    if name == "TruncToInt":
        return f"int({args[0]})"
    if name in ("Mod", "PythonMod"):
        return f"({args[0]} % {args[1]})"
    if name == "Max":
        return f"max({', '.join(args)})"
    if name == "Min":
        return f"min({', '.join(args)})"
    if name in ("CeilToInt", "ceiling"):
        return f"(-((-{args[0]}) // 1))"
    if name in ("FloorToInt", "floor"):
        return f"({args[0]} // 1)"
    if name == "RoundToInt":  # Python's round, half to even, as torch's RoundToInt
        return f"round({args[0]})"
    if name == "CleanDiv":  # an exact division
        return f"({args[0]} // {args[1]})"
    raise SymbolicSizeError(f"cannot print size expression {e} ({name})")


def is_symbolic(v: Any) -> bool:
    """A SymInt/SymFloat/SymBool whose value is not a constant."""
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not v.node.expr.is_number


def has_symbolic_sizes(v: Any) -> bool:
    """A tensor with a symbolic size, stride or offset, or a symbolic scalar."""
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset()))
    return is_symbolic(v)


def shape_env_of(values: Any) -> Any:
    """The ShapeEnv behind the first symbolic value among ``values`` (None when all are static)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            for s in (*v.shape, *v.stride(), v.storage_offset()):
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
        elif is_symbolic(v):
            return v.node.shape_env
    return None


def symbolic_dispatch(symbolic: bool) -> contextlib.AbstractContextManager[Any]:
    """The context fake tensors with symbolic sizes are traced in: torch's Python dispatcher.

    Note: composite ATen ops implemented in C++ read sizes as plain ints in some torch releases
    (torch 2.11's ``matmul`` of a 3-D by a 2-D tensor, reached from ``F.linear`` without bias, asks for
    ``numel()``/``sizes()``); on fake tensors that either raises or, through FakeTensor's ``aten.size``
    handler, turns each size into an int and specialises it (a guard ``s0 == 3`` that makes the
    graph serve one size). Their Python implementations, which the Python dispatcher reaches, keep
    SymInts, as do the meta rules of ops whose C++ kernels refuse SymInt lists (``constant_pad_nd``).
    Static traces keep the C++ path (faster, and nothing to specialise); symbolic ones also compute
    pooled sizes without a parity guard (``floored_pooling_sizes``)."""
    if not symbolic:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(enable_python_dispatcher())
    stack.enter_context(floored_pooling_sizes())
    return stack


_pooling_lock = threading.Lock()
_pooling_depth = 0
_torch_div_rtn: Any = None


def _floor_div(x: Any, y: Any) -> Any:
    return x // y


@contextlib.contextmanager
def floored_pooling_sizes() -> Iterator[None]:
    """Within: torch's pooling meta kernels compute an output size as ``x // stride``, without the
    ``x % stride != 0`` guard some torch releases add.

    Note: torch 2.11's meta kernels (``max_pool2d_with_indices``, ``avg_pool2d``, the 3-D pools) compute
    a pooled size with ``div_rtn(x, y)``: ``q = x // y; r = x % y; if r != 0 and (r < 0) != (y < 0): q -= 1``,
    a port of C++'s round-toward-negative division. On SymInts ``r != 0`` is a guard on the parity of
    the size: a ResNet's max pool after its stride-2 stem recorded ``(((H + 1) // 2) + 1) % 2 != 0``,
    so an export over a range of image sizes was refused and kiln.compile recompiled per parity. The
    adjustment never fires: Python's (and sympy's) ``%`` has the sign of ``y``, so ``(r < 0) == (y < 0)``
    whenever ``r != 0``, and ``div_rtn(x, y) == x // y`` for every ``x`` and ``y != 0`` -- the guard
    protects nothing (torch 2.15's ``div_rtn`` is ``x // y``). Swapping the module's helper for the
    duration of a symbolic trace (counted, so nested and concurrent traces share one swap) keeps the
    meta kernels' every other check, ``ceil_mode``'s included."""
    global _pooling_depth, _torch_div_rtn
    if not hasattr(torch_meta, "div_rtn"):  # a torch without the helper: nothing to swap
        yield
        return
    with _pooling_lock:
        if _pooling_depth == 0:
            _torch_div_rtn, torch_meta.div_rtn = torch_meta.div_rtn, _floor_div
        _pooling_depth += 1
    try:
        yield
    finally:
        with _pooling_lock:
            _pooling_depth -= 1
            if _pooling_depth == 0:
                torch_meta.div_rtn, _torch_div_rtn = _torch_div_rtn, None


def size_hint(v: Any) -> int:
    """The value a (possibly symbolic) size had when it was captured, without adding a guard."""
    if isinstance(v, torch.SymInt):
        hint = v.node.hint
        env = v.node.shape_env
        if hint is None and env is not None:
            hint = env.size_hint(v.node.expr)
        if hint is None:
            raise SymbolicSizeError(f"size {v.node.expr} has no hint (a data-dependent size)")
        return int(hint)
    return int(v)


SymbolBinding = tuple[str, int, int]  # (symbol name, input index, dim of that input or -1 for an int input)


def size_evaluator(values: Any, bindings: Any) -> Callable[[Any], Any]:
    """``args -> values`` where each str inside ``values`` (nested tuples/lists of ints and strs) is a
    Python size expression (``py_expr``) over symbols, read from the call's arguments by ``bindings``.

    Used to rebuild, at run time, a size that was symbolic when the graph was traced (a view of an
    input returned with symbolic sizes), in kiln.autograd's wrapper and in saved programs alike."""
    def render(v: Any) -> str:
        if isinstance(v, str):
            return f"({v})"
        if isinstance(v, (tuple, list)):
            return "(" + "".join(f"{render(x)}, " for x in v) + ")"
        return repr(int(v))
    body = render(values)
    used = [(n, i, d) for n, i, d in bindings if n in body]
    params = ", ".join(n for n, _, _ in used)
    reads = ", ".join(f"args[{i}].shape[{d}]" if d >= 0 else f"args[{i}]" for _, i, d in used)
    src = f"lambda args: (lambda {params}: {body})({reads})" if used else f"lambda args: {body}"
    return eval(src, {"max": max, "min": min})  # noqa: S307 - expressions kiln printed


# sympy size-expression class name -> the Python operation computing it over SymInts (graph nodes)
SIZE_OPS: dict[str, Callable[..., Any]] = {
    "Add": operator.add, "Mul": operator.mul, "FloorDiv": operator.floordiv, "Mod": operator.mod,
    "PythonMod": operator.mod, "Pow": operator.pow, "PowByNatural": operator.pow, "FloatPow": operator.pow,
    "Max": torch.sym_max, "Min": torch.sym_min, "IntTrueDiv": operator.truediv,
    "FloatTrueDiv": operator.truediv, "CleanDiv": operator.floordiv,
}
SIZE_UNARY_OPS: dict[str, Callable[..., Any]] = {"ToFloat": torch.sym_float, "TruncToInt": torch.sym_int,
                                         "FloorToInt": math.floor, "CeilToInt": math.ceil,
                                         "RoundToInt": round, "OpaqueUnaryFn_sqrt": torch.sym_sqrt}


class SymbolNodes:
    """sympy size expression -> the fx node computing it in ``graph``.

    Symbols are bound to a maker (``bind``): a placeholder's ``aten.sym_size.int`` or a SymInt
    placeholder itself, built the first time an expression needs it; compound expressions become
    ``operator`` nodes over those (``SIZE_OPS``). Each new node is inserted by ``insert`` (the caller's
    insertion point; the default appends to the graph) and its ``meta["val"]`` is its SymInt.
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self._nodes: dict[Any, fx.Node] = {}
        self._makers: dict[Any, Callable[[], fx.Node]] = {}

    def bind(self, symbol: Any, make: Callable[[], fx.Node]) -> None:
        """``symbol``'s value is computed by the node ``make()`` builds (first binding wins)."""
        if symbol not in self._makers and symbol not in self._nodes:
            self._makers[symbol] = make

    def bind_node(self, symbol: Any, node: fx.Node) -> None:
        if symbol not in self._nodes:
            self._nodes[symbol] = node

    def bind_tensor(self, node: fx.Node, val: torch.Tensor) -> None:
        """Bind every symbol that is one of ``val``'s sizes to ``aten.sym_size.int(node, dim)``."""
        for d, s in enumerate(val.shape):
            if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                self.bind(s.node.expr, self._size_maker(node, d, s))

    def _size_maker(self, node: fx.Node, dim: int, size: torch.SymInt) -> Callable[[], fx.Node]:
        def make() -> fx.Node:
            n = self.graph.call_function(torch.ops.aten.sym_size.int, (node, dim))
            n.meta["val"] = size
            return n
        return make

    def arg(self, v: Any) -> Any:
        """An op argument: a symbolic SymInt becomes its node, a constant one a Python int."""
        if isinstance(v, torch.SymInt):
            expr = v.node.expr
            return int(expr) if expr.is_number else self.node(expr, v)
        if isinstance(v, torch.SymFloat):
            expr = v.node.expr
            return float(expr) if expr.is_number else self.node(expr, v)
        if isinstance(v, torch.SymBool):
            if v.node.expr.is_number:
                return bool(v.node.expr)
            raise SymbolicSizeError(f"a symbolic bool ({v.node.expr}) cannot be an op argument yet")
        return v

    def node(self, expr: Any, val: Any = None) -> Any:
        """The node (or int) computing ``expr``; ``val``: its SymInt, when the caller has it."""
        got = self._nodes.get(expr)
        if got is not None:
            return got
        if expr.is_Integer:
            return int(expr)
        if expr.is_number:
            return float(expr)
        make = self._makers.pop(expr, None)
        if make is not None:
            n = self._nodes[expr] = make()
            return n
        if expr.is_Symbol:
            raise SymbolicSizeError(f"size symbol {expr} is not a size of any graph input")
        unary = SIZE_UNARY_OPS.get(type(expr).__name__)
        if unary is not None:
            arg = self.node(expr.args[0])
            n = self.graph.call_function(unary, (arg,))
            n.meta["val"] = unary(_val(arg))
            self._nodes[expr] = n
            return n
        op = SIZE_OPS.get(type(expr).__name__)
        if op is None:
            raise SymbolicSizeError(f"size expression {expr} ({type(expr).__name__}) has no graph form")
        args = [self.node(a) for a in expr.args]
        if type(expr).__name__ == "Pow" and expr.exp.is_Integer and 2 <= int(expr.exp) <= 8:
            # ``f * f`` of a float (sympy's f**2) as the products the program computed: a float's
            # ``** 2`` would check f >= 0, and an int's products are its power
            op, args = operator.mul, [args[0]] * int(expr.exp)
        acc = args[0]
        for a in args[1:]:
            acc_val = _val(acc)
            n = self.graph.call_function(op, (acc, a))
            n.meta["val"] = op(acc_val, _val(a))
            acc = n
        self._nodes[expr] = acc
        return acc


def _val(x: Any) -> Any:
    return x.meta["val"] if isinstance(x, fx.Node) else x
