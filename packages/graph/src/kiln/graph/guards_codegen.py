"""The generated guard check: one Python function whose body is an ``and`` chain of the guards.

Fastest per call for small guard sets (~5 us for a small module's 8 guards), but its source grows
by ~100 bytes a guard and ``compile()`` costs ~60 us a guard: ~80 ms for a mobilenet's 1,395. So
``GuardSet.compile()`` uses it up to ``GENERATED_MAX_GUARDS`` guards and the compile-free plan
(``guards_plan``) above; runtime loads always use the plan (``compile_gather``).
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .guards_plan import (
    GLOBAL_STATE_KEYS,
    PLAIN_TENSOR_TYPES,
    default_device,
    flat_tuple,
    global_state,
    plain_tensor,
    resolve_type,
    tensor_ok,
    typed_equal,
)

if TYPE_CHECKING:  # guards.py imports this module
    from .guards import Guard

# Note: 512, not 256: a tiny HF decoder's symbolic decode entry has ~270 guards, checked on every
# token; the chain checks them in ~65 us where the plan takes ~88 (and fails a miss in 34 vs 66), for
# ~9 ms of compile() once per capture (which itself takes seconds). Artifact loads use the plan.
GENERATED_MAX_GUARDS = 512

_BASE = re.compile(r"""^(?:[LG]|_M)\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")
_SYS_MODULES = "__import__('sys').modules"  # how capture roots sources in other modules' globals


def _rooted(source: str) -> str:
    """``source`` with ``__import__('sys').modules`` read as the hoisted ``_M`` (``sys.modules``, as the
    plan reads it): one import call per such guard on every check cost ~1 us each (a Llama decoder's
    guards: ~50 per call), and prefixes under it are now shared like those under ``L`` and ``G``."""
    return source.replace(_SYS_MODULES, "_M") if _SYS_MODULES in source else source
# a segment: ``.get(<source>)`` (an optimizer's ``state.get(param)``: several guards per parameter read the
# same entry, shared like any prefix), ``.name``, or ``[constant]``
_SEGMENT = re.compile(r"""\.get\((?:[^()'"]|'[^']*'|"[^"]*"|\([^()]*\))*\)|\.[A-Za-z_]\w*|\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")


def _prefixes(source: str) -> list[str]:
    """Attribute/subscript prefixes of a source, shortest first (``L['a']``, ``L['a'].b``, ...)."""
    m = _BASE.match(source)
    if m is None:
        return []
    out = [m.group(0)]
    pos = m.end()
    while pos < len(source):
        seg = _SEGMENT.match(source, pos)
        if seg is None:
            break
        pos = seg.end()
        out.append(source[:pos])
    return out


def _global_state_check(expected: tuple) -> str | None:
    """A cheap expression for the common GLOBAL_STATE payload (autocast off)."""
    want = dict(expected)
    if set(want) != GLOBAL_STATE_KEYS:
        return None
    if want["autocast_cpu"] or want["autocast_cuda"]:
        return None  # autocast dtypes matter: use the full snapshot
    autocast_off = ("_any_autocast() is False" if hasattr(torch._C, "_is_any_autocast_enabled")
                    else "_autocast('cpu') is False and _autocast('cuda') is False")
    return (f"(_is_grad() is {bool(want['grad_enabled'])!r} and {autocast_off} and "
            f"str(_default_dtype()) == {want['default_dtype']!r} and "
            f"_deterministic() is {bool(want['deterministic'])!r} and "
            f"_allow_tf32() is {bool(want['matmul_tf32'])!r} and "
            f"({'_len_modes() == 0 or ' if want['default_device'] is None else ''}"
            f"_default_device() == {want['default_device']!r}))")


_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_SHAPE_FUNCTIONS = frozenset({"max", "min", "float", "int", "and", "or", "not", "True", "False"})


class _Compiler:
    """Turns guards into lines of one generated function, with constants hoisted into its globals.

    Note: source prefixes shared by several guards (``L['self']._modules['fc']``) are evaluated once,
    bound with ``:=`` at their first use in the ``and`` chain; later guards read the bound name.
    """

    def __init__(self, guards: tuple[Guard, ...] = ()) -> None:
        self.consts: dict[str, object] = {
            "_tensor_ok": tensor_ok, "_global_state": global_state, "_plain": plain_tensor,
            "_PLAIN_TYPES": PLAIN_TENSOR_TYPES,  # the common case inline, without a Python call
            "_typed_equal": typed_equal,
            "_is_grad": torch.is_grad_enabled, "_autocast": torch.is_autocast_enabled,
            "_default_dtype": torch.get_default_dtype,
            "_deterministic": torch.are_deterministic_algorithms_enabled,
            "_allow_tf32": torch._C._get_cublas_allow_tf32,
            "_len_modes": torch._C._len_torch_function_stack, "_default_device": default_device,
            "_any_autocast": getattr(torch._C, "_is_any_autocast_enabled", None), "_M": sys.modules}
        self.counter = itertools.count()
        self.bound_symbols: set[str] = set()
        counts: dict[str, int] = {}
        for g in guards:
            for p in set(_prefixes(_rooted(g.source))):
                counts[p] = counts.get(p, 0) + 1
        self.shared = {p for p, n in counts.items() if n > 1}
        self.bound: dict[str, str] = {}

    def src(self, source: str) -> str:
        """``source`` rewritten to reuse (or bind) its shared prefixes."""
        best = ""
        for p in _prefixes(source):
            if p in self.shared:
                best = p
        if not best:
            return source
        rest = source[len(best):]
        if best in self.bound:
            return self.bound[best] + rest
        last = _last_segment(best)
        if last.startswith(".get("):  # the key is a source too (a parameter): its bound name, not its path
            inner = self.src(best[:len(best) - len(last)]) + f".get({self.src(last[5:-1])})"
        else:
            inner = self.src(best[:len(best) - len(last)]) + last if last else best
        name = f"_p{len(self.bound)}"
        self.bound[best] = name
        return f"({name} := {inner}){rest}"

    def const(self, value: object) -> str:
        name = f"_c{next(self.counter)}"
        self.consts[name] = value
        return name

    def _device_check(self, t: str, device: torch.device) -> str:
        if device.type == "cpu":  # a bool attribute: no torch.device object made per check
            return f"{t}.is_cpu"
        if device.index is None:  # e.g. "cuda": any cuda:N (see device_matches)
            return f"{t}.device.type == {device.type!r}"
        return f"{t}.device == {self.const(device)}"

    def condition(self, g: Guard) -> str:
        src = self.src(_rooted(g.source)) if g.source else g.source
        if g.kind == "TENSOR_MATCH":
            expected: tuple[Any, ...] = g.expected  # type: ignore[assignment]
            dtype, device, shape, stride, rg = expected
            dt = getattr(torch, str(dtype).removeprefix("torch."))
            if None not in shape and None not in stride:
                t = f"_t{next(self.counter)}"
                return (f"((type({t} := {src}) in _PLAIN_TYPES or _plain({t})) and {t}.dtype is {self.const(dt)} and "
                        f"{t}.requires_grad is {bool(rg)!r} and {t}.shape == {self.const(tuple(shape))} and "
                        f"{t}.stride() == {self.const(tuple(stride))} and "
                        f"{self._device_check(t, torch.device(device))})")
            # dynamic dims (symbolic sizes): inline too; the symbolic strides are SYMBOL/SHAPE_EXPR guards
            t = f"_t{next(self.counter)}"
            sizes = "".join(f" and {t}.shape[{i}] == {int(n)}" for i, n in enumerate(shape) if n is not None)
            if any(s is not None for s in stride):
                sizes += f" and ({t}_s := {t}.stride()) is not None" + "".join(
                    f" and {t}_s[{i}] == {int(n)}" for i, n in enumerate(stride) if n is not None)
            return (f"((type({t} := {src}) in _PLAIN_TYPES or _plain({t})) and {t}.dtype is {self.const(dt)} and "
                    f"{t}.requires_grad is {bool(rg)!r} and {t}.dim() == {len(shape)}{sizes} and "
                    f"{self._device_check(t, torch.device(device))})")
        if g.kind == "TYPE_MATCH":
            cls = resolve_type(str(g.expected))
            if cls is not None:
                return f"type({src}) is {self.const(cls)}"
            return f"(type({src}).__module__ + ':' + type({src}).__qualname__) == {g.expected!r}"
        if g.kind == "ID_MATCH":
            return f"id({src}) == {g.expected!r}"
        if g.kind == "EQUALS_MATCH":
            if flat_tuple(g.expected):  # the items' types too: (True, 1) == (1, 1)
                items = tuple(type(x) for x in g.expected)  # type: ignore[attr-defined]
                v = f"_t{next(self.counter)}"
                return (f"(type({v} := {src}) is tuple and {v} == {self.const(g.expected)} and "
                        f"tuple(map(type, {v})) == {self.const(items)})")
            if type(g.expected) is tuple:
                return f"_typed_equal({src}, {self.const(g.expected)})"
            return f"(type({src}) is {self.const(type(g.expected))} and {src} == {self.const(g.expected)})"
        if g.kind == "LENGTH_MATCH":
            return f"len({src}) == {g.expected!r}"
        if g.kind == "DICT_KEYS":
            keys: tuple[Any, ...] = g.expected  # type: ignore[assignment]
            return f"list({src}.keys()) == {self.const(list(keys))}"
        if g.kind == "GLOBAL_STATE":
            fast = _global_state_check(g.expected)  # type: ignore[arg-type]
            return fast if fast is not None else f"_global_state() == {self.const(g.expected)}"
        if g.kind == "SYMBOL":
            # a local of the check (``_y_s0``): bound at the symbol's first read, compared at the others
            name = str(g.expected)
            if name in self.bound_symbols:
                return f"({src} == _y_{name})"
            self.bound_symbols.add(name)
            return f"((_y_{name} := {src}) is not None)"
        if g.kind == "SHAPE_EXPR":
            # inline Python over the bound sizes: evaluating the text per call would parse and compile
            # it on every hit (~90 us per relation)
            expr = str(g.expected)
            names = set(_IDENT.findall(expr))
            if names <= self.bound_symbols | _SHAPE_FUNCTIONS:
                return "(" + _IDENT.sub(lambda m: f"_y_{m.group(0)}" if m.group(0) in self.bound_symbols
                                        else m.group(0), expr) + ")"
            return f"_eval_shape({g.expected!r}, {self._symbol_dict()})"
        if g.kind == "NOT_NONE":
            return f"{src} is not None"
        if g.kind == "IS_NONE":
            return f"{src} is None"
        raise AssertionError(g.kind)


    def _symbol_dict(self) -> str:
        """The symbols bound so far, as a dict expression (for a relation evaluated from its text)."""
        return "{" + ", ".join(f"{n!r}: _y_{n}" for n in sorted(self.bound_symbols)) + "}"


def _last_segment(prefix: str) -> str:
    parts = _prefixes(prefix)
    if len(parts) < 2:
        return ""
    return prefix[len(parts[-2]):]




def generated_check(guards: tuple) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool]:
    """One generated function ``check(L, G) -> bool`` for ``guards``."""
    comp = _Compiler(guards)
    conds = [comp.condition(g) for g in guards]
    body = " and\n        ".join(conds) or "True"
    uses_eval = any(g.kind == "SHAPE_EXPR" for g in guards)
    helpers = "    def _eval_shape(expr, S): return bool(eval(expr, {}, S))\n" if uses_eval else ""
    src = f"def check(L, G):\n{helpers}    return bool(\n        {body})\n"
    ns: dict[str, Any] = dict(comp.consts)
    exec(compile(src, "<kiln guards>", "exec"), ns)  # noqa: S102 - our generated check
    fn = ns["check"]
    fn.__kiln_source__ = src
    return fn
