"""Guards as data: what a trace assumed, checkable by capture (in-process) and runtime (loaded artifacts).

A guard names a *source* — a Python expression over ``L`` (the frame's locals) and ``G`` (its
globals), such as ``L['self'].layers[0].weight`` — a *kind*, and the *expected* value. A GuardSet
compiles into one check function (``guards_plan``) so checking an entry costs a single call.

Note: DESIGN.md has capture compile guards; the compiler lives here instead because runtime must
re-check guards of a loaded artifact without importing capture, and two compilers of one format
would drift. Capture adds its fast paths by ordering guards, not by a second code generator.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .guards_codegen import GENERATED_MAX_GUARDS, generated_check
from .guards_native import native_check
from .guards_plan import build_plan, global_state, plain_tensor, plan_check, plan_layout
from .guards_plan import default_device as default_device  # re-exported (kiln.graph API)
from .guards_plan import device_matches as device_matches  # re-exported (kiln.graph API)
from .guards_plan import source_tree as source_tree  # re-exported (kiln.graph API)
from .guards_simplify import simplify_guards

GUARD_KINDS: dict[str, str] = {
    "TENSOR_MATCH": "dtype, device, shape (None = dynamic), stride (None = dynamic), requires_grad",
    "TYPE_MATCH": "type(x) is the class named 'module:qualname'",
    "ID_MATCH": "x is the very object seen at trace time (in-process only)",
    "EQUALS_MATCH": "x == a constant (int, float, str, bool, None, tuples of them) of the same "
                    "type; a tuple's items of the same types too",
    "LENGTH_MATCH": "len(x) == n",
    "DICT_KEYS": "list(x.keys()) == the keys seen, in order",
    "GLOBAL_STATE": "grad mode, autocast, default dtype and device, and deterministic flags",
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
        if self.kind == "SYMBOL":  # symbolic sizes read as relations over named sizes
            return f"{self.kind:<13} {self.expected} := {self.source}"
        if self.kind == "SHAPE_EXPR":
            return f"{self.kind:<13} {self.expected}" + (f"  # {self.note}" if self.note else "")
        return f"{self.kind:<13} {self.source or '<global>'} == {self.expected!r}"


def tensor_expectation(t: torch.Tensor, dynamic_dims: frozenset[int] = frozenset(),
                       strides: tuple[int | None, ...] | None = None) -> tuple:
    """The TENSOR_MATCH payload for ``t``; dims in ``dynamic_dims`` are not pinned. ``strides``: a
    tensor with dynamic dims pins these (None: a symbolic stride the caller guards otherwise)."""
    shape = tuple(None if i in dynamic_dims else int(s) for i, s in enumerate(t.shape))
    if dynamic_dims:
        stride: tuple = strides if strides is not None else tuple(None for _ in t.stride())
    else:
        stride = tuple(int(s) for s in t.stride())
    return (str(t.dtype), str(t.device), shape, stride, bool(t.requires_grad))


def type_name(t: type) -> str:
    return f"{t.__module__}:{t.__qualname__}"


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

    def simplified(self) -> GuardSet:
        """The same checks without duplicates and without guards the others imply (a constant
        tuple's EQUALS_MATCH implies its TYPE_MATCH, LENGTH_MATCH and its items' guards)."""
        kept = simplify_guards(self.guards)
        return self if len(kept) == len(self.guards) else GuardSet(kept)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"source": g.source, "kind": g.kind, "expected": _jsonable(g.expected), "note": g.note}
                for g in self.guards if g.portable]

    @staticmethod
    def from_json(rows: list[dict[str, Any]]) -> GuardSet:
        return GuardSet(tuple(Guard(r["source"], r["kind"], _hashable(r["expected"]), r.get("note", ""))
                              for r in rows))

    def compile(self) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool]:
        """One function ``check(L, G) -> bool``; cached on the set."""
        if self._check:
            return self._check[0]
        fn = native_check(self.guards, _python_check) or _python_check(self.guards)
        self._check.append(fn)
        return fn

    def compile_gather(self, outputs: Sequence[str], tree: Sequence[tuple[str, int, str]] | None = None
                       ) -> Callable[[Mapping[str, Any], Mapping[str, Any]], list | None]:
        """``check(L, G)`` returning the values of ``outputs`` (sources over L and G) when every
        guard holds, else None: one pass, shared source prefixes read once for guards and outputs.
        ``tree``: a saved ``source_tree`` of the sources (a load skips splitting them)."""
        return plan_check(self.guards, outputs, tree)

    def gather_layout(self, outputs: Sequence[str], tree: Sequence[tuple[str, int, str]] | None = None
                      ) -> dict[str, Any]:
        """``compile_gather(outputs)``'s plan as JSON data (reads and guard indices), which
        ``compile_layout`` turns into the same check without analysing the guards again."""
        return plan_layout(self.guards, outputs, tree)

    def compile_layout(self, layout: Mapping[str, Any], records: Sequence[Any] | None = None
                       ) -> Callable[[Mapping[str, Any], Mapping[str, Any]], list | None]:
        """The check of ``gather_layout`` (made from these very guards, in this order). Raises
        ValueError (or IndexError/KeyError/TypeError) when the layout does not fit. ``records``:
        the guards as lighter objects with ``source``, ``kind`` and ``expected`` (a loader's rows),
        used instead of the Guards themselves."""
        return build_plan(layout, self.guards if records is None else records)

    def first_failure(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> tuple[Guard, str] | None:
        """The first guard that fails on (L, G) with the actual value seen, for recompile reasons."""
        symbols: dict[str, Any] = {}
        for g in self.guards:
            ok, actual = _check_one(g, L, G, symbols)
            if not ok:
                return g, actual
        return None

    def changed_floats(self, L: Mapping[str, Any], G: Mapping[str, Any]) -> list[Guard]:
        """The float constants (``EQUALS_MATCH`` on a float) whose value differs on (L, G): automatic
        dynamic makes them all symbolic at once (an optimizer step's lr and bias corrections)."""
        out = []
        for g in self.guards:
            if g.kind != "EQUALS_MATCH" or not (type(g.expected) is float or _float_tuple(g.expected)):
                continue
            try:
                ok, _ = _check_one(g, L, G, {})
                now = eval(g.source, {"L": L, "G": G}) if not ok and type(g.expected) is tuple else None  # noqa: S307
            except Exception:  # noqa: BLE001 - a source that no longer resolves: not a changed float
                continue
            if ok:
                continue
            if type(g.expected) is float:
                out.append(g)
            elif isinstance(g.expected, tuple) and type(now) is tuple and len(now) == len(g.expected):
                # a float in a tuple (Adam's betas under OneCycleLR): the items that changed
                out += [Guard(f"{g.source}[{i}]", "EQUALS_MATCH", was, g.note)
                        for i, (was, v) in enumerate(zip(g.expected, now))
                        if type(was) is float and type(v) is float and v != was]
        return out


_SHOWN = 160  # characters of a value a recompile reason shows (an optimizer's state printed whole was pages)


def _python_check(guards: tuple[Guard, ...]) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool]:
    """Small sets: the generated and-chain (fastest per call, cheap to compile); large ones: the plan,
    which needs no compile() (~80 ms for 1,400 guards) and costs about as much per call."""
    if len(guards) <= GENERATED_MAX_GUARDS:
        return generated_check(guards)
    return plan_check(guards)


def _describe(v: object, kind: str = "") -> str:
    """The value a failed guard saw, as a recompile reason shows it: what the guard compares (a dict's
    keys, a length, a type), a tensor as its (dtype, device, shape, stride, requires_grad), and any
    other value's repr cut to a line."""
    if isinstance(v, torch.Tensor):
        prefix = "" if plain_tensor(v) else f"a {type(v).__name__} (a tensor subclass) "
        return prefix + repr(tensor_expectation(v))
    try:
        if kind == "DICT_KEYS" and hasattr(v, "keys"):
            keys = list(v.keys())  # type: ignore[attr-defined]
            shown = ", ".join(_short(k) for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
            return f"{len(keys)} key(s) ({_cut(shown)})"
        if kind == "LENGTH_MATCH" and hasattr(v, "__len__"):
            return f"length {len(v)}"  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001, S110 - a value that cannot be described so is shown as itself
        pass
    if kind == "TYPE_MATCH":
        return f"{type(v).__module__}:{type(v).__qualname__}"
    return _short(v)


def _short(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor({str(v.dtype).removeprefix('torch.')}, {tuple(v.shape)}, {v.device})"
    try:
        text = repr(v)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not hide the recompile reason
        text = f"<{type(v).__name__}: repr failed: {type(e).__name__}>"
    return _cut(text)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def _float_tuple(value: Any) -> bool:
    return type(value) is tuple and any(type(v) is float for v in value)


def _check_one(g: Guard, L: Mapping[str, Any], G: Mapping[str, Any],
               symbols: dict[str, Any]) -> tuple[bool, str]:
    if g.kind == "GLOBAL_STATE":
        now = global_state()
        was: dict[str, Any] = dict(tuple(g.expected))  # type: ignore[arg-type]
        changed = [f"{k} is {v!r}, was {was.get(k)!r}" for k, v in now if was.get(k) != v]
        return now == g.expected, "; ".join(changed) or repr(now)
    if g.kind == "SHAPE_EXPR":
        try:
            return bool(eval(str(g.expected), {}, symbols)), repr(symbols)
        except NameError as e:  # a relation over a symbol no SYMBOL guard bound: it cannot hold
            return False, f"<{e}: a size symbol with no source>"
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
    return single(L, G), _describe(value, g.kind)


def expected_to_json(v: Any) -> Any:
    """A guard's expected value as JSON data (tuples, dtypes and devices tagged)."""
    return _jsonable(v)


def expected_from_json(v: Any) -> Any:
    """The inverse of ``expected_to_json``."""
    return _hashable(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return {"tuple": [_jsonable(x) for x in v]}
    if isinstance(v, torch.dtype):  # e.g. EQUALS_MATCH on a dtype argument
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    return v


_JSON_SCALARS = frozenset({int, str, bool, float, type(None)})


def _hashable(v: Any) -> Any:
    if type(v) in _JSON_SCALARS:  # most expected values (800-1,400 guards per mobilenet load)
        return v
    if type(v) is dict and len(v) == 1 and type(items := v.get("tuple")) is list:
        if _JSON_SCALARS.issuperset(map(type, items)):  # shapes, strides, conv tuples: C-level
            return tuple(items)
        return tuple(map(_hashable, items))
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(_hashable(x) for x in v["tuple"])
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return getattr(torch, v["dtype"])
    if isinstance(v, dict) and set(v) == {"device"}:
        return torch.device(v["device"])
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v
