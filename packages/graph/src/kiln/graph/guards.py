"""Guards as data: what a trace assumed, checkable by capture (in-process) and runtime (loaded artifacts).

A guard names a *source* — a Python expression over ``L`` (the frame's locals) and ``G`` (its
globals), such as ``L['self'].layers[0].weight`` — a *kind*, and the *expected* value. A GuardSet
compiles into one generated Python function so checking an entry costs a single call.

Note: DESIGN.md has capture compile guards; the compiler lives here instead because runtime must
re-check guards of a loaded artifact without importing capture, and two compilers of one format
would drift. Capture adds its fast paths by ordering guards, not by a second code generator.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

GUARD_KINDS: dict[str, str] = {
    "TENSOR_MATCH": "dtype, device, shape (None = dynamic), stride (None = dynamic), requires_grad",
    "TYPE_MATCH": "type(x) is the class named 'module:qualname'",
    "ID_MATCH": "x is the very object seen at trace time (in-process only)",
    "EQUALS_MATCH": "x == a constant (int, float, str, bool, None, tuples of them)",
    "LENGTH_MATCH": "len(x) == n",
    "DICT_KEYS": "list(x.keys()) == the keys seen, in order",
    "GLOBAL_STATE": "grad mode, autocast, default dtype and deterministic flags",
    "SYMBOL": "binds a size symbol: expected is the symbol name, source its size expression",
    "SHAPE_EXPR": "a Python boolean expression over size symbols, e.g. 's0 >= 2'",
    "NOT_NONE": "x is not None",
    "IS_NONE": "x is None",
}


@dataclass(frozen=True, slots=True)
class Guard:
    source: str
    kind: str
    expected: Hashable
    note: str = ""  # the user line or assumption that created it, for readable recompile reasons

    def __post_init__(self) -> None:
        if self.kind not in GUARD_KINDS:
            raise ValueError(f"unknown guard kind {self.kind!r}")

    @property
    def portable(self) -> bool:
        """Whether the guard means the same thing in another process (ID_MATCH does not)."""
        return self.kind != "ID_MATCH"

    def as_text(self) -> str:
        return f"{self.kind:<13} {self.source or '<global>'} == {self.expected!r}"


def global_state() -> tuple[tuple[str, Hashable], ...]:
    """The global torch state a graph depends on, as a hashable snapshot."""
    return (
        ("grad_enabled", torch.is_grad_enabled()),
        ("autocast_cpu", torch.is_autocast_enabled("cpu")),
        ("autocast_cuda", torch.is_autocast_enabled("cuda")),
        ("autocast_cpu_dtype", str(torch.get_autocast_dtype("cpu"))),
        ("autocast_cuda_dtype", str(torch.get_autocast_dtype("cuda"))),
        ("default_dtype", str(torch.get_default_dtype())),
        ("deterministic", torch.are_deterministic_algorithms_enabled()),
    )


def tensor_expectation(t: torch.Tensor, dynamic_dims: frozenset[int] = frozenset()) -> tuple:
    """The TENSOR_MATCH payload for ``t``; dims in ``dynamic_dims`` are not pinned."""
    shape = tuple(None if i in dynamic_dims else int(s) for i, s in enumerate(t.shape))
    if dynamic_dims:
        stride: tuple = tuple(None for _ in t.stride())
    else:
        stride = tuple(int(s) for s in t.stride())
    return (str(t.dtype), str(t.device), shape, stride, bool(t.requires_grad))


def _resolve_type(name: str) -> type | None:
    module, _, qual = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj if isinstance(obj, type) else None


def type_name(t: type) -> str:
    return f"{t.__module__}:{t.__qualname__}"


def device_matches(actual: torch.device, expected: torch.device) -> bool:
    """``cuda`` (no index, as written by a cross-compiling host) matches any ``cuda:N``."""
    if expected.index is None:
        return actual.type == expected.type
    return actual == expected


def _tensor_ok(v: object, dtype: torch.dtype, device: torch.device, shape: tuple, stride: tuple,
               requires_grad: bool) -> bool:
    if not isinstance(v, torch.Tensor) or v.dtype is not dtype or v.requires_grad != requires_grad:
        return False
    if v.dim() != len(shape) or not device_matches(v.device, device):
        return False
    got_shape = v.shape
    for want, got in zip(shape, got_shape):
        if want is not None and want != got:
            return False
    got_stride = v.stride()
    for want, got in zip(stride, got_stride):
        if want is not None and want != got:
            return False
    return True


_BASE = re.compile(r"""^[LG]\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")
_SEGMENT = re.compile(r"""\.[A-Za-z_]\w*|\[(?:'[^']*'|"[^"]*"|-?\d+)\]""")


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
    if set(want) != {"grad_enabled", "autocast_cpu", "autocast_cuda", "autocast_cpu_dtype",
                     "autocast_cuda_dtype", "default_dtype", "deterministic"}:
        return None
    if want["autocast_cpu"] or want["autocast_cuda"]:
        return None  # autocast dtypes matter: use the full snapshot
    autocast_off = ("_any_autocast() is False" if hasattr(torch._C, "_is_any_autocast_enabled")
                    else "_autocast('cpu') is False and _autocast('cuda') is False")
    return (f"(_is_grad() is {bool(want['grad_enabled'])!r} and {autocast_off} and "
            f"str(_default_dtype()) == {want['default_dtype']!r} and "
            f"_deterministic() is {bool(want['deterministic'])!r})")


class _Compiler:
    """Turns guards into lines of one generated function, with constants hoisted into its globals.

    Note: source prefixes shared by several guards (``L['self']._modules['fc']``) are evaluated once,
    bound with ``:=`` at their first use in the ``and`` chain; later guards read the bound name.
    """

    def __init__(self, guards: tuple[Guard, ...] = ()) -> None:
        self.consts: dict[str, object] = {
            "_tensor_ok": _tensor_ok, "_global_state": global_state, "_Tensor": torch.Tensor,
            "_is_grad": torch.is_grad_enabled, "_autocast": torch.is_autocast_enabled,
            "_default_dtype": torch.get_default_dtype,
            "_deterministic": torch.are_deterministic_algorithms_enabled,
            "_any_autocast": getattr(torch._C, "_is_any_autocast_enabled", None)}
        self.counter = itertools.count()
        counts: dict[str, int] = {}
        for g in guards:
            for p in set(_prefixes(g.source)):
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
        inner = self.src(best[:len(best) - len(_last_segment(best))]) + _last_segment(best) \
            if _last_segment(best) else best
        name = f"_p{len(self.bound)}"
        self.bound[best] = name
        return f"({name} := {inner}){rest}"

    def const(self, value: object) -> str:
        name = f"_c{next(self.counter)}"
        self.consts[name] = value
        return name

    def _device_check(self, t: str, device: torch.device) -> str:
        if device.index is None and device.type != "cpu":  # e.g. "cuda": any cuda:N (see device_matches)
            return f"{t}.device.type == {device.type!r}"
        return f"{t}.device == {self.const(device)}"

    def condition(self, g: Guard) -> str:
        src = self.src(g.source) if g.source else g.source
        if g.kind == "TENSOR_MATCH":
            expected: tuple[Any, ...] = g.expected  # type: ignore[assignment]
            dtype, device, shape, stride, rg = expected
            dt = getattr(torch, str(dtype).removeprefix("torch."))
            if None not in shape and None not in stride:
                t = f"_t{next(self.counter)}"
                return (f"(isinstance({t} := {src}, _Tensor) and {t}.dtype is {self.const(dt)} and "
                        f"{t}.requires_grad is {bool(rg)!r} and {t}.shape == {self.const(tuple(shape))} and "
                        f"{t}.stride() == {self.const(tuple(stride))} and "
                        f"{self._device_check(t, torch.device(device))})")
            return (f"_tensor_ok({src}, {self.const(dt)}, {self.const(torch.device(device))}, "
                    f"{self.const(shape)}, {self.const(stride)}, {rg!r})")
        if g.kind == "TYPE_MATCH":
            cls = _resolve_type(str(g.expected))
            if cls is not None:
                return f"type({src}) is {self.const(cls)}"
            return f"(type({src}).__module__ + ':' + type({src}).__qualname__) == {g.expected!r}"
        if g.kind == "ID_MATCH":
            return f"id({src}) == {g.expected!r}"
        if g.kind == "EQUALS_MATCH":
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
            return f"_bind({g.expected!r}, {src})"
        if g.kind == "SHAPE_EXPR":
            return f"_eval_shape({g.expected!r})"
        if g.kind == "NOT_NONE":
            return f"{src} is not None"
        if g.kind == "IS_NONE":
            return f"{src} is None"
        raise AssertionError(g.kind)


@dataclass(frozen=True)
class GuardSet:
    """An ordered, printable set of guards; ``compile()`` gives the fast check function."""

    guards: tuple[Guard, ...] = ()
    _check: list = field(default_factory=list, repr=False, compare=False, hash=False)

    def __iter__(self):
        return iter(self.guards)

    def __len__(self) -> int:
        return len(self.guards)

    def portable(self) -> GuardSet:
        return GuardSet(tuple(g for g in self.guards if g.portable))

    def as_text(self) -> str:
        return "\n".join(g.as_text() for g in self.guards) or "(no guards)"

    def to_json(self) -> list[dict[str, Any]]:
        return [{"source": g.source, "kind": g.kind, "expected": _jsonable(g.expected), "note": g.note}
                for g in self.guards if g.portable]

    @staticmethod
    def from_json(rows: list[dict[str, Any]]) -> GuardSet:
        return GuardSet(tuple(Guard(r["source"], r["kind"], _hashable(r["expected"]), r.get("note", ""))
                              for r in rows))

    def compile(self) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool]:
        """One generated function ``check(L, G) -> bool``; cached on the set."""
        if self._check:
            return self._check[0]
        comp = _Compiler(self.guards)
        conds = [comp.condition(g) for g in self.guards]
        body = " and\n        ".join(conds) or "True"
        uses_symbols = any(g.kind in ("SYMBOL", "SHAPE_EXPR") for g in self.guards)
        prologue = "    S = {}\n" if uses_symbols else ""
        helpers = ("    def _bind(name, value):\n"
                   "        if name in S: return S[name] == value\n"
                   "        S[name] = value; return True\n"
                   "    def _eval_shape(expr): return bool(eval(expr, {}, S))\n") if uses_symbols else ""
        src = f"def check(L, G):\n{prologue}{helpers}    return bool(\n        {body})\n"
        ns: dict[str, Any] = dict(comp.consts)
        exec(compile(src, "<kiln guards>", "exec"), ns)
        fn = ns["check"]
        fn.__kiln_source__ = src
        self._check.append(fn)
        return fn

    def first_failure(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> tuple[Guard, str] | None:
        """The first guard that fails on (L, G) with the actual value seen, for recompile reasons."""
        symbols: dict[str, Any] = {}
        for g in self.guards:
            ok, actual = _check_one(g, L, G, symbols)
            if not ok:
                return g, actual
        return None


def _last_segment(prefix: str) -> str:
    parts = _prefixes(prefix)
    if len(parts) < 2:
        return ""
    return prefix[len(parts[-2]):]


def _describe(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return repr(tensor_expectation(v))
    return repr(v)


def _check_one(g: Guard, L: Mapping[str, Any], G: Mapping[str, Any],
               symbols: dict[str, Any]) -> tuple[bool, str]:
    if g.kind == "GLOBAL_STATE":
        now = global_state()
        return now == g.expected, repr(now)
    if g.kind == "SHAPE_EXPR":
        return bool(eval(str(g.expected), {}, symbols)), repr(symbols)
    try:
        value = eval(g.source, {"L": L, "G": G})
    except Exception as e:  # the source no longer resolves: that is a failure, not a crash
        return False, f"<{type(e).__name__}: {e}>"
    if g.kind == "SYMBOL":
        name = str(g.expected)
        if name in symbols:
            return symbols[name] == value, repr(value)
        symbols[name] = value
        return True, repr(value)
    single = GuardSet((g,)).compile()
    return single(L, G), _describe(value)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return {"tuple": [_jsonable(x) for x in v]}
    if isinstance(v, torch.dtype):  # e.g. EQUALS_MATCH on a dtype argument
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    return v


def _hashable(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(_hashable(x) for x in v["tuple"])
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return getattr(torch, v["dtype"])
    if isinstance(v, dict) and set(v) == {"device"}:
        return torch.device(v["device"])
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v
