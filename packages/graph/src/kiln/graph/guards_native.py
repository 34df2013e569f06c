"""A guard set's check in native code, when kiln.runtime has loaded its checker (``install``).

Why: a compiled call checks its entry's guards first, and in Python that costs about 0.1 us a guard
(a ResNet-50's 933: ~97 us on a 2-core CI host) and ~0.3 us a tensor (an optimizer step's 160 tensors:
61 us of a 120 us step), where torch.compile checks in C++. The native checker
(kiln.runtime's ``native_guards.cpp``) runs the same reads and checks as one C loop: reads of source
chains (``L['self']._modules['fc'].weight``, ``.get(<source>)``) each made once, at the first check that
needs it; ID/TYPE/EQUALS/LENGTH/DICT_KEYS/IS_NONE/NOT_NONE and TENSOR_MATCH checks with their Python
meaning; a tensor of an unusual type (a subclass, a non-tensor) or with symbolic sizes makes the native
check answer None, and that call is checked by the Python check of the whole set.

The guards it does not take (GLOBAL_STATE, size symbols and relations, a source that is not a chain of
attributes and subscripts) stay with the Python check (``guards_codegen``/``guards_plan``), which runs
first; both must hold. kiln.graph itself builds nothing: without ``install`` (kiln.capture alone,
KILN_NATIVE_GUARDS=0, no C++ compiler) every check is Python, with the same answers.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .guards_plan import PLAIN_TENSOR_TYPES, resolve_type

Check = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]

# node ops and check kinds: the enums of native_guards.cpp
OP_L, OP_G, OP_CONST, OP_ATTR, OP_ITEM, OP_GET = range(6)
KINDS = {"ID_MATCH": 0, "TYPE_MATCH": 1, "EQUALS_MATCH": 2, "LENGTH_MATCH": 3, "DICT_KEYS": 4, "IS_NONE": 5,
         "NOT_NONE": 6, "TENSOR_MATCH": 7}

_ROOT = re.compile(r"""([LG])\[('[^'\\]*'|"[^"\\]*"|-?\d+)\]""")
_ATTR = re.compile(r"\.([A-Za-z_]\w*)")
_ITEM = re.compile(r"""\[('[^'\\]*'|"[^"\\]*"|-?\d+)\]""")
_SYS_MODULES = "__import__('sys').modules"


class _Native:
    """The loaded checker module (``kiln_native_guards``), or None."""

    module: Any = None


_NATIVE = _Native()


def install(module: Any) -> None:
    """Use ``module`` (kiln.runtime's built ``kiln_native_guards``) for guard sets compiled from now on."""
    module.set_plain_types(*_plain_types())
    module.calibrate(_probe_tensors())
    _NATIVE.module = module


def uninstall() -> None:
    _NATIVE.module = None


def installed() -> bool:
    return _NATIVE.module is not None


def current() -> Any:
    """The installed checker module, or None."""
    return _NATIVE.module


def _plain_types() -> tuple[type, type, type]:
    types = (torch.Tensor, torch.nn.Parameter, torch.nn.parameter.Buffer)
    assert set(types) == PLAIN_TENSOR_TYPES  # the types plain_tensor takes without asking further
    return types


def _probe_tensors() -> list[torch.Tensor]:
    """Tensors of each plain type, leaf and not, views and not: where ``calibrate`` looks for the pointer."""
    base = torch.arange(6.0)
    grad = torch.ones(3, requires_grad=True)
    return [torch.zeros(2), base[2:].view(2, 2), grad, grad * 2, torch.nn.Parameter(torch.ones(2)),
            torch.nn.parameter.Buffer(torch.zeros(3)), torch.empty(0, dtype=torch.int64)]


class _Program:
    """Nodes and checks for the native ``Program``: one node per distinct source prefix."""

    def __init__(self, native: Any) -> None:
        self.native = native
        self.nodes: list[tuple[int, int, object]] = [(OP_L, -1, None), (OP_G, -1, None)]
        self.known: dict[str, int] = {}
        self.checks: list[tuple[int, int, object]] = []

    def _add(self, op: int, parent: int, arg: object, text: str) -> int:
        node = self.known.get(text)
        if node is None:
            node = self.known[text] = len(self.nodes)
            self.nodes.append((op, parent, arg))
        return node

    def node(self, source: str) -> int | None:
        """The node reading ``source``, or None when it is not a chain this checker reads."""
        node = self.known.get(source)
        if node is not None:
            return node
        end = _chain_end(source, 0)
        if end != len(source):
            return None
        return self._read(source, 0, len(source))

    def _read(self, source: str, start: int, end: int) -> int | None:
        """Nodes for ``source[start:end]`` (a whole chain), parents first."""
        if source.startswith(_SYS_MODULES, start):
            pos = start + len(_SYS_MODULES)
            node = self._add(OP_CONST, -1, sys.modules, _SYS_MODULES)
        else:
            m = _ROOT.match(source, start)
            if m is None:
                return None
            pos = m.end()
            node = self._add(OP_ITEM, 0 if m.group(1) == "L" else 1, ast.literal_eval(m.group(2)),
                             source[start:pos])
        while pos < end:
            if source.startswith(".get(", pos):
                close = _chain_end(source, pos + 5)
                if close is None or close >= end or source[close] != ")":
                    return None
                key = self._read(source, pos + 5, close)
                if key is None:
                    return None
                pos = close + 1
                node = self._add(OP_GET, node, key, source[start:pos])
                continue
            m = _ATTR.match(source, pos)
            if m is not None and not source.startswith("(", m.end()):
                pos = m.end()
                node = self._add(OP_ATTR, node, sys.intern(m.group(1)), source[start:pos])
                continue
            m = _ITEM.match(source, pos)
            if m is None:
                return None
            pos = m.end()
            node = self._add(OP_ITEM, node, ast.literal_eval(m.group(1)), source[start:pos])
        return node

    def check(self, g: Any) -> bool:
        """Add ``g``'s check; False when this checker does not take it."""
        kind = KINDS.get(g.kind)
        if kind is None:
            return False
        arg: object = g.expected
        if g.kind == "TYPE_MATCH":
            arg = resolve_type(str(g.expected))
            if arg is None:
                return False
        elif g.kind == "DICT_KEYS":
            arg = list(g.expected)
        elif g.kind == "TENSOR_MATCH":
            arg = self._tensor(g.expected)
        elif g.kind in ("ID_MATCH", "LENGTH_MATCH") and type(g.expected) is not int:
            return False
        node = self.node(g.source)
        if node is None:
            return False
        self.checks.append((kind, node, arg))
        return True

    def _tensor(self, expected: tuple) -> tuple:
        dtype, device, shape, stride, rg = expected
        dt = getattr(torch, str(dtype).removeprefix("torch."))
        dev = torch.device(device)
        return (_scalar_type(self.native, dt), _device_type(self.native, dev.type),
                -1 if dev.index is None else dev.index, tuple(shape), tuple(stride), bool(rg))


_SCALAR_TYPES: dict[torch.dtype, int] = {}
_DEVICE_TYPES: dict[str, int] = {}


def _scalar_type(native: Any, dt: torch.dtype) -> int:
    got = _SCALAR_TYPES.get(dt)
    if got is None:
        got = _SCALAR_TYPES[dt] = native.scalar_type(torch.empty(0, dtype=dt))
    return got


def _device_type(native: Any, name: str) -> int:
    got = _DEVICE_TYPES.get(name)
    if got is None:
        got = _DEVICE_TYPES[name] = native.device_type(name)
    return got


def _chain_end(source: str, pos: int) -> int | None:
    """Where the chain starting at ``pos`` ends (brackets and quotes balanced), or None."""
    depth, quote = 0, ""
    i = pos
    while i < len(source):
        ch = source[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return i if depth == 0 and not quote else None


def _bare(source: str) -> bool:
    m = _ROOT.match(source)
    return m is not None and m.end() == len(source)


def native_check(guards: Sequence[Any], python_check: Callable[[tuple], Check]) -> Check | None:
    """``guards`` checked by the installed native checker, the guards it does not take by
    ``python_check(remainder)``: ``check(L, G) -> bool``. None when no checker is installed or it would
    take no guard."""
    native = _NATIVE.module
    if native is None:
        return None
    program = _Program(native)
    rest: list[int] = []
    # guards on a bare argument first: a call with another input shape fails before any module is read
    order = sorted(range(len(guards)), key=lambda i: not _bare(guards[i].source or ""))
    for i in order:
        if not program.check(guards[i]):
            rest.append(i)
    if not program.checks:
        return None
    run = native.Program(program.nodes, program.checks)
    python = python_check(tuple(guards[i] for i in sorted(rest))) if rest else None
    whole: list[Check] = []  # the Python check of every guard, made when a call first needs it

    def check(L: Mapping[str, Any], G: Mapping[str, Any]) -> bool:
        if python is not None and not python(L, G):
            return False
        answer = run(L, G)
        if answer is None:  # a value the native loop leaves to Python (a tensor subclass, symbolic sizes)
            if not whole:
                whole.append(python_check(tuple(guards)))
            return bool(whole[0](L, G))
        return answer
    check.__kiln_native__ = (len(program.checks), len(rest))  # type: ignore[attr-defined]
    return check


# ---- the checker's self-test ---------------------------------------------------------------------

class _Probe:
    """An object the self-test's guards read attributes of."""


class _Sub(torch.Tensor):
    """A tensor subclass without a ``__torch_dispatch__`` of its own (the checker asks Python)."""


class _G:
    __slots__ = ("source", "kind", "expected")

    def __init__(self, source: str, kind: str, expected: object) -> None:
        self.source, self.kind, self.expected = source, kind, expected


def _payload(t: torch.Tensor, dynamic: tuple[int, ...] = ()) -> tuple:
    shape = tuple(None if i in dynamic else s for i, s in enumerate(t.shape))
    stride = tuple(None if dynamic else s for s in t.stride())
    return (str(t.dtype), str(t.device), shape, stride, bool(t.requires_grad))


def _probe_frame() -> dict[str, Any]:
    t = torch.zeros(2, 3)
    o = _Probe()
    o.t, o.p, o.n, o.flag, o.x = t, torch.nn.Parameter(torch.ones(3)), 3, True, 0.5  # type: ignore[attr-defined]
    o.tup, o.d, o.none, o.lst = (1, 2.0, (3,)), {"a": 1, "b": 2}, None, [t, t]  # type: ignore[attr-defined]
    o.dyn = torch.zeros(4, 3)  # type: ignore[attr-defined]
    return {"o": o, "k": "a", "x": t}


def _probe_guards(frame: dict[str, Any]) -> list[_G]:
    o = frame["o"]
    return [
        _G("L['x']", "TENSOR_MATCH", _payload(frame["x"])), _G("L['k']", "EQUALS_MATCH", "a"),
        _G("L['o']", "TYPE_MATCH", f"{__name__}:_Probe"), _G("L['o'].t", "TENSOR_MATCH", _payload(o.t)),
        _G("L['o'].p", "TENSOR_MATCH", _payload(o.p)), _G("L['o'].n", "EQUALS_MATCH", 3),
        _G("L['o'].flag", "EQUALS_MATCH", True), _G("L['o'].x", "EQUALS_MATCH", 0.5),
        _G("L['o'].tup", "EQUALS_MATCH", (1, 2.0, (3,))), _G("L['o'].d", "DICT_KEYS", ("a", "b")),
        _G("L['o'].d['b']", "EQUALS_MATCH", 2), _G("L['o'].lst", "LENGTH_MATCH", 2),
        _G("L['o'].lst[-1]", "ID_MATCH", id(o.t)), _G("L['o'].d.get(L['k'])", "EQUALS_MATCH", 1),
        _G("L['o'].none", "IS_NONE", None), _G("L['o'].t", "NOT_NONE", None),
        _G("L['o'].dyn", "TENSOR_MATCH", _payload(o.dyn, dynamic=(0,))),
    ]


def _probe_changes() -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    def attr(name: str, value: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
        return lambda f: setattr(f["o"], name, value(f["o"]))
    return [
        ("nothing", lambda f: None),
        ("dtype", attr("t", lambda o: o.t.double())), ("shape", attr("t", lambda o: torch.zeros(3, 2))),
        ("stride", attr("t", lambda o: torch.zeros(3, 2).t())), ("requires_grad", attr("t", lambda o: o.t.requires_grad_())),
        ("a plain tensor for a parameter", attr("p", lambda o: o.p.detach().clone())),
        ("a subclass", attr("t", lambda o: o.t.as_subclass(_Sub))),
        ("a rank", attr("t", lambda o: torch.zeros(6))), ("int for float", attr("x", lambda o: 1)),
        ("1 for True", attr("flag", lambda o: 1)), ("float for int", attr("n", lambda o: 3.0)),
        ("a tuple item's type", attr("tup", lambda o: (1, 2, (3,)))), ("a nested tuple", attr("tup", lambda o: (1, 2.0, (3.0,)))),
        ("key order", attr("d", lambda o: {"b": 2, "a": 1})), ("an item", attr("d", lambda o: {"a": 1, "b": 3})),
        ("a length", attr("lst", lambda o: [o.t, o.t, o.t])), ("an identity", attr("lst", lambda o: [o.t, o.t.clone()])),
        ("a .get key", lambda f: f.update(k="b")), ("None", attr("none", lambda o: 0)),
        ("a missing attribute", lambda f: delattr(f["o"], "n")), ("a type", lambda f: f.update(o=_Sub())),
        ("a dynamic size", attr("dyn", lambda o: torch.zeros(7, 3))), ("a static size beside it", attr("dyn", lambda o: torch.zeros(7, 4))),
        ("an argument", lambda f: f.update(x=torch.zeros(2, 4))), ("a dict subclass", attr("d", lambda o: _Keys(a=1, b=2))),
    ]


class _Keys(dict):
    def keys(self):  # type: ignore[override]
        return ["b", "a"]


def _answer(check: Check, frame: dict[str, Any]) -> bool:
    try:
        return bool(check(frame, {}))
    except Exception:  # a read that raises fails the entry (its caller's rule)
        return False


def self_test(module: Any) -> str | None:
    """None when ``module``'s checks answer as the Python checks do on a table of cases (each kind,
    passing and failing, tensors by dtype, shape, stride, requires_grad and type, reads that raise),
    else the first case where they differ."""
    from .guards_codegen import generated_check
    from .guards_plan import plan_check
    saved = _NATIVE.module
    try:
        install(module)
        for what, change in _probe_changes():
            frame = _probe_frame()
            guards = tuple(_probe_guards(frame))
            native = native_check(guards, generated_check)
            if native is None:
                return "it took none of the self-test's guards"
            change(frame)
            want = [_answer(generated_check(guards), frame), _answer(plan_check(guards), frame)]
            got = _answer(native, frame)
            if want != [got, got]:
                return f"{what}: native {got}, Python {want}"
    finally:
        _NATIVE.module = saved
    return None
