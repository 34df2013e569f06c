"""The capture's ShapeEnv: symbolic tensor sizes whose range includes 1, every decision on 1 guarded.

Note: torch's ShapeEnv specialises sizes 0 and 1 and gives every other size symbol the range
``[2, inf)``, so a dim that became dynamic at batch 5 needs a graph of its own for batch 1, and a
stream of batches 1-8 compiles three times (static, symbolic, size 1). Here a tensor size symbol traced
at a size >= 2 gets the range ``[1, inf)`` instead (``mark_dynamic(min=2)`` still narrows it), and
nothing assumes it is not 1: a question the trace, autograd, decomp or inductor asks about it
(``s == 1`` in a squeeze, a contiguity check, ``if x.shape[0] == 1``) is answered from the example
size and recorded as a guard (``Ne(s0, 1)``), so a size-1 call that would take another
path fails the guard and compiles its own graph (where 1 is a constant again). Sizes 0 and 1 seen at
trace time still specialise, and 0 stays outside every range (empty tensors have contiguity and
stride rules of their own; a size-0 call fails ``s0 >= 1`` and compiles for 0).

Guarding every ``s == 1`` would guard ``Ne(s0, 1)`` for every broadcast of ``[s0, n]`` against a
literal 1 (a bias, a mask, position ids) and every reshape of a batch, though their result is the
same for 1. So a question asked by one of torch's shape rules in ``_SIZE_ONE_RULES`` is answered from
the example with no guard, where the rule's answer cannot change what it computes: broadcast shapes
(the output size is the same expression for a size-1 call, and the relation the non-broadcast path
relies on stays a ``torch._check``, a guard here), the layout picked for a new elementwise or
converted tensor (for a size-1 call it can differ only in the stride of that size-1 dim, which no
index reads), a contiguity check on a dim whose stride is the contiguous one anyway, and reshape or
view of a tensor contiguous for every size (the contiguous view of the new shape, whatever the
algorithm asks). The example's answer is kept, so the trace is the one the guard would have made.
Every other question is guarded, ``guard_or_false`` ones included: torch's ``squeeze`` keeps a dim
it cannot prove is 1, which for a size-1 call gives ``[1, n]`` where eager gives ``[n]`` (why
torch's ``backed_size_oblivious``, which answers all of them by default, is not used);
``.contiguous()`` of a tensor that is contiguous only when the batch is 1 is its input or a copy.
Questions asked from C++ (SDPA's checks) have no rule frame and are guarded, except inside a
``reshape``, ``view`` or ``.contiguous()`` that aliases its tensor at the example's sizes
(``aliases_at_example``) or copies at every size the question could be 1 (``copies_at_one``), inside a
``FRESH_RESULT`` call, and the ``guard_or_false`` ones of the C++ in ``_CPP_SIZE_ONE_RULES`` (c10's
symbolic contiguity, the autograd engine's gradient-size check), which name their source file. A torch
release that renames a rule costs recompiles, never a wrong result.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import math
import re
import sys
from collections.abc import Callable
from typing import Any, Literal

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.graph import view_strides

_FAKE_IMPLS, _REFS = "torch/_subclasses/fake_impls.py", "torch/_refs/__init__.py"


def _contiguity_answer_is_free(env: ShapeEnv, frame: Any) -> bool:
    """In torch's ``check_contiguous_sizes_strides``, which skips the stride of a dim of size 1: a dim
    whose stride is the contiguous one (as every dim of a contiguous tensor has) gives the same answer
    either way; and where a pointwise rule asks, the answer only picks the layout of its new output,
    which for a size-1 call differs at most in the stride of that size-1 dim. Elsewhere (reshape and
    view: a view or a copy; ``.contiguous()``: the input or a copy) the question is guarded."""
    y = frame.f_locals.get("y")
    if any(_known_equal(env, y, frame.f_locals.get(e)) for e in ("expected_stride", "expected_stride_max")):
        return True
    return _asked_for_new_layout(frame)


def _reshape_line_of_contiguous(env: ShapeEnv, frame: Any) -> bool:
    """The question comes from a line ``t.reshape(...)``/``t.view(...)`` of a ``t`` contiguous for every
    size: the result is the contiguous view of the new shape whatever is asked about a size 1."""
    m = _RESHAPE_CALL.search(linecache.getline(frame.f_code.co_filename, frame.f_lineno))
    return m is not None and _known_contiguous(env, frame.f_locals.get(m.group(1)))


def _reshaping_contiguous(env: ShapeEnv, frame: Any) -> bool:
    for _ in range(16):  # the core algorithm calls prims whose fake dispatch asks
        if frame is None:
            return False
        if frame.f_code.co_name == "_reshape_view_helper_core_alg":
            return _known_contiguous(env, frame.f_locals.get("a"))
        frame = frame.f_back
    return False


def _known_contiguous(env: ShapeEnv, t: Any) -> bool:
    """Whether ``t``'s strides are the contiguous ones of its shape for every size in range."""
    if not isinstance(t, torch.Tensor):
        return False
    expected: Any = 1
    for size, stride in reversed(tuple(zip(t.shape, t.stride(), strict=True))):
        if not (type(size) is int and size == 1) and not _known_equal(env, stride, expected):
            return False
        expected = expected * size
    return True


def _sorting_for_new_layout(frame: Any) -> bool:
    caller = frame.f_back
    return caller is not None and caller.f_code.co_name == "_is_non_overlapping_and_dense_or_false" and \
        _asked_for_new_layout(caller)


def _asked_for_new_layout(frame: Any) -> bool:
    for _ in range(8):  # the rule is a few frames up (is_contiguous_for_memory_format_or_false...)
        frame = frame.f_back
        if frame is None:
            return False
        if frame.f_code.co_name in _POINTWISE_LAYOUT and frame.f_code.co_filename.replace("\\", "/").endswith(
                _POINTWISE_LAYOUT[frame.f_code.co_name]):
            return True
    return False


# rules that ask whether a tensor is contiguous or dense only to pick the layout of a new tensor
_POINTWISE_LAYOUT = {"fast_binary_impl": _FAKE_IMPLS,
                     "compute_elementwise_output_logical_to_physical_perm": "torch/_prims_common/__init__.py",
                     "_convert_element_type_meta": "torch/_prims/__init__.py"}


def _known_equal(env: ShapeEnv, a: Any, b: Any) -> bool:
    if a is None or b is None:
        return False
    ea, eb = (v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(v) for v in (a, b))
    return env._maybe_evaluate_static(sympy.Eq(ea, eb)) == sympy.true


# torch's shape rules where a size question is answered from the example with no guard (see the
# note above): (file path suffix, function name) -> a check of the rule's frame that the answer
# cannot change what it computes, or None where the rule is written for either answer
_SIZE_ONE_RULES: dict[tuple[str, str], Callable[[ShapeEnv, Any], bool] | None] = {
    (_FAKE_IMPLS, "infer_size"): None,
    (_FAKE_IMPLS, "fast_binary_impl"): None,  # the fast path or the slow one: the same result
    (_REFS, "_broadcast_shapes"): None,
    (_REFS, "should_expand"): None,
    # the strides it gives a broadcast dim (0, or the input's where the size is 1): strides of a
    # size-1 dim, which no index reads
    ("torch/_prims/__init__.py", "_broadcast_in_dim_meta"): None,
    ("torch/_prims_common/__init__.py", "check_contiguous_sizes_strides"): _contiguity_answer_is_free,
    # its "fewer than 2 elements": the same, asked before the strides are checked
    ("torch/_prims_common/__init__.py", "is_contiguous"): lambda env, frame: _asked_for_new_layout(frame),
    # dense or not (its element count and the order of its strides), where it picks the layout of a
    # new tensor: as above
    ("torch/_prims_common/__init__.py", "_is_non_overlapping_and_dense_or_false"):
        lambda env, frame: _asked_for_new_layout(frame),
    # the order of an elementwise output's dims, from its operands' strides
    ("torch/_prims_common/__init__.py", "should_swap"): None,
    # channels-last or not, where a pointwise rule picks its fast path (the slow one orders the
    # output's dims from the same strides: the same layout) or a converted tensor's layout: as above
    ("torch/_prims_common/__init__.py", "is_channels_last_contiguous_2d"):
        lambda env, frame: _asked_for_new_layout(frame),
    ("torch/_prims_common/__init__.py", "is_channels_last_contiguous_3d"):
        lambda env, frame: _asked_for_new_layout(frame),
    # the stride order ``_is_non_overlapping_and_dense_or_false`` sorts dims by (its ``K.__lt__``),
    # where it picks the layout of a new tensor: strides tie only beside a size-1 dim, as above
    ("torch/_prims_common/__init__.py", "__lt__"): lambda env, frame: _sorting_for_new_layout(frame),
    # how reshape splits and merges the dims of a tensor that is contiguous for every size: the
    # result is the contiguous view of the (already checked) new shape whatever path it takes
    (_REFS, "_reshape_view_helper_core_alg"): lambda env, frame: _reshaping_contiguous(env, frame),
    ("torch/_prims/__init__.py", "_collapse_view_helper"): lambda env, frame: _reshaping_contiguous(env, frame),
    # matmul folds the batch dims of its operand with ``t1.reshape(...)`` (a C++ call that asks)
    ("torch/_decomp/decompositions.py", "matmul"): lambda env, frame: _reshape_line_of_contiguous(env, frame),
    # a backend's FX interpreter running a captured reshape, view or contiguous (see aliases_at_example)
    ("torch/fx/interpreter.py", "call_method"): lambda env, frame: _fx_view_or_copy(env, frame),
    # ... or a captured FRESH_RESULT call (F.linear, F.scaled_dot_product_attention)
    ("torch/fx/interpreter.py", "call_function"): lambda env, frame: _fx_fresh_result(frame),
}
# torch's C++ whose ``TORCH_GUARD_OR_FALSE``/``TORCH_GUARD_OR_TRUE`` questions on a size being 1 are
# answered from the example with no guard (SymNode.guard_or_false gets the asking source file):
# - c10's symbolic contiguity (``_compute_contiguous_sym`` and its channels-last and dense kin) asks
#   them only in a quick check that, where it cannot say "contiguous", returns the exact symbolic
#   condition instead (``Eq(s0, 1) | Eq(stride, expected)``), which the caller evaluates (a guard);
# - the autograd engine's ``InputMetadata::maybe_reduce`` asks whether a gradient's expected size is
#   1 to sum a broadcast gradient down to it, and on "not 1" requires ``size == grad's size`` (a
#   guard where it is not provable): where the gradient has the expected size (every gradient the
#   joint trace sees of a symbolic dim) a size-1 call sums nothing either;
# - ATen's ExpandUtils.h: ``sum_to`` (a backward formula's reduction of a broadcast gradient) asks the
#   same and checks the same (``TORCH_MAYBE_SYM_CHECK``), and ``expand_inplace``/``expand_outplace``
#   borrow a tensor or expand it to sizes equal to its own: the same values either way.
_CPP_SIZE_ONE_RULES = ("c10/core/Contiguity.h", "torch/csrc/autograd/input_metadata.cpp", "aten/src/ATen/ExpandUtils.h")
_GUARD_OR = frozenset({"guard_or_false", "guard_or_true"})
_FAR = 2**20 + 7  # added to each size for "far larger sizes" (odd: no small divisor hides a Mod or //)
_RESHAPE_CALL = re.compile(r"(\w+)\.(?:reshape|view)\(")
_SHAPE_ENV_FILES = ("torch/fx/experimental/symbolic_shapes.py", "torch/fx/experimental/sym_node.py",
                    "torch/fx/experimental/recording.py", "torch/__init__.py")  # SymBool.__bool__


class CaptureShapeEnv(ShapeEnv):
    """A ShapeEnv whose tensor size symbols may be 1 (see the module's note)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.may_be_one: set[sympy.Symbol] = set()  # size symbols with the range [1, inf)
        # a reshape, view or contiguous in progress whose size-1 questions are answered without a guard
        # (view_or_copy): True, or a test of the question's symbols; a FRESH_RESULT call: True
        self._view_answers_free: bool | Callable[[frozenset], bool] = False

    def create_symbol(self, val: Any, source: Any, dynamic_dim: DimDynamic = DimDynamic.DUCK,
                      constraint_dim: Any = None, positive: bool | None = True,
                      do_not_specialize_zero_one: bool = False, symbolic_context: Any = None) -> sympy.Expr:
        one = bool(type(val) is int and val >= 2 and positive is True and dynamic_dim is not DimDynamic.STATIC
               and _is_size_source(source))
        sym = super().create_symbol(val, source, dynamic_dim, constraint_dim, positive,
                                    do_not_specialize_zero_one or one, symbolic_context)
        if one and isinstance(sym, sympy.Symbol) and sym not in self.may_be_one:
            vr = self.var_to_range[sym]
            if vr.lower < 1:  # [0, inf) from do_not_specialize_zero_one: 0 stays out
                self.constrain_symbol_range(sym, compiler_min=1, compiler_max=vr.upper)
            self.may_be_one.add(sym)
        return sym

    def evaluate_sym_node(self, sym_node: Any, size_oblivious: bool = False,
                          fallback_value: bool | None = None) -> sympy.Basic:
        expr = sym_node.expr
        # where the answer cannot change what the asking rule computes, the example's answer is
        # returned with no guard: the trace takes the path it would have taken with the guard
        hint = sym_node.hint
        if type(hint) is bool and self.may_be_one and expr.free_symbols and expr.free_symbols <= self.may_be_one:
            free = self._view_answers_free
            if (_answer_is_free(self, expr, fallback_value is not None) or
                    free and about_one(expr) and not _asked_by_check() and
                    (free is True or free(frozenset(expr.free_symbols)))) and self._generic_answer(expr, hint):
                return sympy.true if hint else sympy.false
        return super().evaluate_sym_node(sym_node, size_oblivious, fallback_value)

    def _generic_answer(self, expr: sympy.Basic, hint: bool) -> bool:
        """Whether the example answers as far larger sizes do: the sizes compared with 1 are not 1 at
        the example. A size symbol is never 1 at the example (it was traced at >= 2), but an expression
        of them can be (``s0 - 4`` at ``s0 = 5``): there a broadcast rule told "it is 1" takes the other
        operand's size (``x[4:] * 3`` came out of size 1 for every size), so the answer is guarded."""
        known = self.backed_var_to_val if hasattr(self, "backed_var_to_val") else self.var_to_val  # torch > 2.11
        far = {sym: known[sym] + _FAR for sym in expr.free_symbols if sym in known}
        try:
            return bool(expr.xreplace(far)) == hint
        except TypeError:  # not decidable from the values: guarded
            return False

    def view_or_copy(self, t: torch.Tensor, name: str, args: tuple, run: Callable[[], Any]) -> Any:
        """``run()``, ``t.<name>(*args)`` (a reshape, view or contiguous: ``t`` itself or a view of it
        where it can be, else a copy), with its questions on sizes being 1 answered from the example
        with no guard when it gives a view at the example's sizes (``aliases_at_example``)."""
        return self._answering(aliases_at_example(t, name, args) or _copy_test(t, name, args), run)

    def fresh_result(self, run: Callable[[], Any]) -> Any:
        """``run()``, a call of a ``FRESH_RESULT`` function, with its questions on sizes being 1 answered
        from the example with no guard (``torch._check`` relations stay guards): see FRESH_RESULT."""
        return self._answering(True, run)

    def _answering(self, free: bool | Callable[[frozenset], bool], run: Callable[[], Any]) -> Any:
        outer, self._view_answers_free = self._view_answers_free, free
        try:
            return run()
        finally:
            self._view_answers_free = outer


VIEW_OR_COPY = frozenset({"reshape", "view", "contiguous"})  # methods view_or_copy serves
# Functions whose result is a new tensor (never a view of an argument) of sizes given by their inputs'
# and whose paths compute the same values: ATen's linear asks from C++ whether its input is contiguous
# and how to flatten its batch dims into one matrix (addmm over a view or a copy, or matmul; for a
# weight without bias on CUDA ``Ne(s0, 1)`` and ``1024 < 1024*s0*s1``, a third compile of an H200
# serving stream at batch 1). The flattened input never leaves the call, so view or copy does not
# matter. Scaled dot-product attention picks its kernel from sizes (on CUDA ``Ne(b, 1)`` while
# broadcasting batch dims, ``Ne(s, 1)`` where a kernel's checks read the length): the same function of
# q, k, v and the mask, in an output whose layout differs at most in a size-1 dim's stride. The
# relations the paths rely on (equal head dims, broadcastable batches) are ``torch._check``s or
# relations between sizes, which stay guards.
FRESH_RESULT = frozenset({id(torch.nn.functional.linear), id(torch.nn.functional.scaled_dot_product_attention)})


def aliases_at_example(t: Any, name: str, args: tuple) -> bool:
    """Whether ``t.<name>(*args)`` returns ``t`` or a view of it at the sizes the trace was made with.

    Note: ATen's reshape, view and contiguous ask whether a size is 1 to skip its stride
    (``computeStride`` chunks dims by ``guard_or_true(size != 1)``; contiguity checks skip size-1
    dims), from C++, where no rule frame says who asks. At the example's sizes (>= 2 for every size
    symbol that may be 1) the answer is "not 1", the stricter path: every stride is checked. A result
    that aliases ``t`` on it aliases it for a size-1 call too, with the same strides on every dim but
    the size-1 one (which no index reads), so the answers need no guard; where it is a copy (or
    ``view`` raises), a size-1 call may get a view, and aliasing would differ, so they are guarded."""
    if name == "contiguous":
        return not args and _contiguous_at_example(t)
    return name in ("reshape", "view") and _view_at_example(t, args)


def _copy_test(t: Any, name: str, args: tuple) -> Callable[[frozenset], bool] | Literal[False]:
    """For a reshape or contiguous that copies at the example's sizes: a test of a question's symbols,
    ``copies_at_one`` with them (answers cached); False where it does not apply."""
    if name not in ("reshape", "contiguous") or not isinstance(t, torch.Tensor) or (name == "contiguous") == bool(args):
        return False
    known: dict[frozenset, bool] = {}

    def test(symbols: frozenset) -> bool:
        if symbols not in known:
            known[symbols] = copies_at_one(t, name, args, symbols)
        return known[symbols]
    return test


def copies_at_one(t: Any, name: str, args: tuple, symbols: frozenset) -> bool:
    """Whether ``t.reshape(...)`` or ``t.contiguous()`` copies at the example's sizes and for every choice
    of ``symbols`` (those a question asks about) being 1, the other sizes at the example's: then a call
    where they are 1 copies as the trace does, and the size-1 question picks nothing (HF attention's
    ``attn_output.transpose(1, 2).reshape(b, s, -1)`` copies at every batch; at length 1 it is a view,
    so a question on the length stays a guard, which a call of length 1 fails)."""
    ones = sorted(symbols, key=str)
    if not ones or len(ones) > 6:
        return False
    for k in range(len(ones) + 1):
        for subset in itertools.combinations(ones, k):
            at = {sym: 1 for sym in subset}

            def value(v: Any, at: dict = at) -> int | None:
                return _int_at(v, at)
            if (_contiguous_at(t, value) if name == "contiguous" else _view_at(t, args, value)) is not False:
                return False
    return True


def _shape_arg(args: tuple) -> tuple:
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else tuple(args)


def _contiguous_at_example(t: Any) -> bool:
    return _contiguous_at(t, _example_int) is True


def _contiguous_at(t: Any, value: Callable[[Any], int | None]) -> bool | None:
    """Whether ``t`` is contiguous with its sizes and strides valued by ``value`` (None: unknown)."""
    if not isinstance(t, torch.Tensor):
        return None
    sizes, strides = [value(v) for v in t.shape], [value(v) for v in t.stride()]
    if None in sizes or None in strides:
        return None
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size  # type: ignore[operator]
    return True


def _view_at_example(t: Any, shape: tuple) -> bool:
    """Whether ``t.view(*shape)`` exists at the example's sizes."""
    return _view_at(t, shape, _example_int) is True


def _view_at(t: Any, shape: tuple, value: Callable[[Any], int | None]) -> bool | None:
    """Whether ``t.view(*shape)`` exists with sizes valued by ``value`` (None: unknown or invalid)."""
    if not isinstance(t, torch.Tensor):
        return None
    sizes, strides, new = ([value(v) for v in vs] for vs in (t.shape, t.stride(), _shape_arg(shape)))
    if not new or None in sizes or None in strides or None in new:
        return None
    numel = math.prod(sizes)  # type: ignore[arg-type]
    known = math.prod(s for s in new if s != -1)  # type: ignore[misc]
    if new.count(-1) > 1 or numel == 0 or known == 0:
        return None
    new = [numel // known if s == -1 else s for s in new]
    if math.prod(new) != numel:  # type: ignore[arg-type]
        return None
    return view_strides(sizes, strides, new) is not None


def _int_at(v: Any, at: dict) -> int | None:
    """``v``'s value with the symbols of ``at`` set to their values there, the others at the example's."""
    if not isinstance(v, torch.SymInt):
        return v if type(v) is int else None
    expr = v.node.expr
    if not expr.free_symbols & at.keys():
        return _example_int(v)
    env: Any = v.node.shape_env
    known = getattr(env, "backed_var_to_val", None) or env.var_to_val  # renamed after torch 2.11
    hints = {sym: at.get(sym, known.get(sym)) for sym in expr.free_symbols}
    if any(h is None for h in hints.values()):
        return None
    try:
        out = sympy.sympify(expr.xreplace({sym: sympy.Integer(h) for sym, h in hints.items()}))
    except ZeroDivisionError:  # ``s // (h // 4)`` at h = 1: no such size there (the caller's "unknown")
        return None
    return int(out) if out.is_Integer else None


def _example_int(v: Any) -> int | None:
    if isinstance(v, torch.SymInt):
        hint = v.node.hint
        return int(hint) if hint is not None else None
    return v if type(v) is int else None


def _fx_view_or_copy(env: ShapeEnv, frame: Any) -> bool:
    """An FX interpreter (a backend tracing the captured graph again) running ``t.reshape(...)``,
    ``t.view(...)`` or ``t.contiguous()``: as in ``CaptureShapeEnv.view_or_copy``."""
    args, kwargs = frame.f_locals.get("args"), frame.f_locals.get("kwargs")
    return frame.f_locals.get("target") in VIEW_OR_COPY and isinstance(args, tuple) and len(args) >= 1 \
        and not kwargs and (aliases_at_example(args[0], frame.f_locals["target"], args[1:]) or
                            _fx_copies(env, frame, args))


def _fx_fresh_result(frame: Any) -> bool:
    """An FX interpreter (a backend tracing the captured graph again) running a ``FRESH_RESULT`` call:
    as in ``CaptureShapeEnv.fresh_result``."""
    return id(frame.f_locals.get("target")) in FRESH_RESULT


def _fx_copies(env: ShapeEnv, frame: Any, args: tuple) -> bool:
    """The FX-interpreter form of ``_copy_test``, for the question being asked (in the frame below)."""
    test = _copy_test(args[0], frame.f_locals["target"], args[1:])
    if test is False:
        return False
    asking: Any = sys._getframe(1)
    while asking is not None and asking.f_code.co_name != "evaluate_sym_node":
        asking = asking.f_back
    node = asking.f_locals.get("sym_node") if asking is not None else None
    return node is not None and test(frozenset(node.expr.free_symbols))


def _asked_by_check() -> bool:
    """Whether a ``torch._check`` (a relation the caller's path relies on) asks the question."""
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.replace("\\", "/").endswith(_SHAPE_ENV_FILES):
        if frame.f_code.co_name in _CHECKS:
            return True
        frame = frame.f_back
    return False


def _is_size_source(source: Any) -> bool:
    """A tensor's ``size()[i]`` (torch's TensorPropertySource), not a stride, an offset or a Python int."""
    prop = getattr(source, "prop", None)
    return prop is not None and getattr(prop, "name", None) == "SIZE"


def _answer_is_free(env: ShapeEnv, expr: sympy.Basic, guard_or: bool) -> bool:
    """Whether the size question being evaluated comes from a rule of ``_SIZE_ONE_RULES`` whose result
    the answer cannot change. ``guard_or``: asked by ``guard_or_false``/``guard_or_true``; the rules
    without a check answer only those (their ``torch._check`` relations are guarded). A question a
    ``torch._check`` asks is always guarded: it is the relation the rule's path relies on."""
    frame: Any = sys._getframe(2)  # above evaluate_sym_node
    while frame is not None and frame.f_code.co_filename.replace("\\", "/").endswith(_SHAPE_ENV_FILES):
        if frame.f_code.co_name in _CHECKS:
            return False
        if guard_or and frame.f_code.co_name in _GUARD_OR and about_one(expr) and \
                str(frame.f_locals.get("file", "")).replace("\\", "/").endswith(_CPP_SIZE_ONE_RULES):
            return True  # asked from C++ (which passes its source file): see _CPP_SIZE_ONE_RULES
        frame = frame.f_back
    if frame is None:
        return False
    path, name = frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_name
    for (suffix, rule_name), check in _SIZE_ONE_RULES.items():
        if name == rule_name and path.endswith(suffix):
            if rule_name not in _RESHAPES and not about_one(expr):
                return False  # a relation between sizes (s0 == s1): its answer may change the result
            return guard_or if check is None else check(env, frame)
    return False


_RESHAPES = frozenset({"_reshape_view_helper_core_alg", "_collapse_view_helper", "matmul"})


def about_one(expr: sympy.Basic) -> bool:
    """Whether ``expr`` compares sizes with 1 (``Eq(s0, 1)``, ``s0*s1 < 2``), alone or combined, also
    scaled (``Ne(1024*s0, 1024)``: a stride compared with one row's; ``1024 < 1024*s0*s1``: an element
    count with one row's)."""
    rels = [expr] if isinstance(expr, sympy.core.relational.Relational) else \
        list(expr.atoms(sympy.core.relational.Relational))
    return bool(rels) and all(_compares_with_one(r) for r in rels)


def _compares_with_one(r: sympy.Basic) -> bool:
    if r.lhs in (1, 2) or r.rhs in (1, 2):
        return True
    _, primitive = sympy.expand(r.lhs - r.rhs).as_content_primitive()
    const, rest = primitive.as_coeff_Add()
    sign, product = rest.as_coeff_Mul()
    if const in (1, -1, 2, -2) and sign in (1, -1) and bool(product.free_symbols) and \
            all(f.is_Symbol or f.is_Pow and f.base.is_Symbol and f.exp.is_Integer for f in sympy.Mul.make_args(product)):
        return True
    return _one_against_the_rest(r)


@functools.lru_cache(maxsize=4096)
def _one_against_the_rest(r: sympy.Basic) -> bool:
    """A relation over one size symbol that holds at 1 and at no size >= 2, or the other way round
    (``s < s**2``: a stride order asked by a layout rule): a question whether the size is 1."""
    if len(r.free_symbols) != 1 or not isinstance(r, (sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)):
        return False
    (sym,) = r.free_symbols
    diff = sympy.expand(r.lhs - r.rhs)
    if not diff.is_polynomial(sym) or sympy.degree(diff, sym) > 4:
        return False  # solveset of floor/Mod expressions can recurse without end
    try:
        holds = sympy.solveset(r, sym, domain=sympy.S.Reals).intersect(sympy.Interval(1, sympy.oo))
    except Exception:  # noqa: BLE001 - sympy could not decide: not recognised, so guarded
        return False
    return holds in (sympy.FiniteSet(1), sympy.Interval.Lopen(1, sympy.oo), sympy.Interval(2, sympy.oo))


_CHECKS = frozenset({"_check", "_check_with", "_check_is_size", "expect_true", "guard_or_defer_runtime_assert"})
