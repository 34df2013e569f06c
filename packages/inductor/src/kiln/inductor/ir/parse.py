"""The loop IR's text form read back: ``parse_program(p.as_text()).as_text() == p.as_text()``.

Why: pass tests written as text (golden files: an input program, the expected output program), as
TVM's and MLIR's pass tests are, need programs that are read, not built in Python.

The text shows every buffer's layout and every body's structure; what it leaves out is inferred:
- a load's dtype is its buffer's; an op's result dtype comes from its operands (compare and logical
  ops give bool), and a constant or ``index(...)`` value takes the dtype its context needs (the
  node's layout dtype at the root; int64 for indirect indices and random offsets);
- devices are ``device`` (the text does not print them), nodes have no ``origins``, an extern call is
  named after its last output (``buf3`` -> ``extern4``, as lowering names them), and an extern's
  outputs sit at paths ``()`` (one output) or ``(k,)``.
So programs print the same after a round trip, and equal the original wherever those guesses hold
(the tests check both).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import sympy
import torch

from .expr import OPS, Cast, Constant, Expr, IndexValue, Load, Op
from .index import FloorDiv, IndexExpr, ModIndex, index_var
from .nodes import (
    Arg,
    ComputedBuffer,
    ConstArg,
    ExternKernel,
    ExternOutput,
    InputBuffer,
    Layout,
    ListArg,
    LoopData,
    Node,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    TensorRef,
)
from .program import LoopProgram, Output


class IRParseError(ValueError):
    """The text is not a loop program; the message names the line."""


# ---- index expressions (index_str's form, and sympy's str for scatter indices and symbolic dims) -----

_LOOP_VAR = re.compile(r"([irxd])(\d+)")


def _symbol(name: str) -> sympy.Symbol:
    m = _LOOP_VAR.fullmatch(name)
    if m:
        return index_var(m[1], int(m[2]))
    return sympy.Symbol(name, integer=True, positive=True)  # a size symbol (s0)


def parse_index(text: str) -> IndexExpr:
    """An index expression as ``index_str`` (or sympy) prints it: ``8*i0 + (i1)//2 + (r0)%4``."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return sympy.Integer(int(text))
    # ``(a)//b`` and ``(a)%b`` -> FloorDiv/ModIndex calls; the rest is sympy's own syntax
    src = _divmod_calls(text)
    names = {n: _symbol(n) for n in set(re.findall(r"[A-Za-z_]\w*", src)) if n not in _FUNCS}
    try:
        return sympy.sympify(src, locals={**names, **_FUNCS})  # type: ignore[no-any-return]
    except (sympy.SympifyError, SyntaxError, TypeError) as e:
        raise IRParseError(f"bad index expression {text!r}: {e}") from e


_FUNCS = {"FloorDiv": FloorDiv, "ModIndex": ModIndex}


def _divmod_calls(text: str) -> str:
    """Rewrite every ``(a)//b`` / ``(a)%b`` as ``FloorDiv(a, b)`` / ``ModIndex(a, b)``, innermost first."""
    while True:
        m = re.search(r"\)(//|%)", text)
        if m is None:
            return text
        start = _matching_open(text, m.start())
        divisor = re.match(r"-?\d+|[A-Za-z_]\w*|\(", text[m.end():])
        if divisor is None:
            raise IRParseError(f"bad divisor in index {text!r}")
        end = m.end() + divisor.end()
        if divisor[0] == "(":
            end = _matching_close(text, m.end()) + 1
        call = "FloorDiv" if m[1] == "//" else "ModIndex"
        text = f"{text[:start]}{call}({text[start + 1:m.start()]}, {text[m.end():end]}){text[end:]}"


def _matching_open(text: str, close: int) -> int:
    depth = 0
    for k in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(text[k], 0)
        if depth == 0:
            return k
    raise IRParseError(f"unbalanced parentheses in {text!r}")


def _matching_close(text: str, open_: int) -> int:
    depth = 0
    for k in range(open_, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return k
    raise IRParseError(f"unbalanced parentheses in {text!r}")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes."""
    out, depth, start, quote = [], 0, 0, ""
    for k, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, k):
            out.append(text[start:k])
            start = k + len(sep)
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()] if sep == "," else [s.strip() for s in out]


def _dims(text: str) -> tuple[IndexExpr, ...]:
    return tuple(parse_index(d) for d in _split_top(text))


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise IRParseError(f"unknown dtype {name!r}")
    return d


_LAYOUT = re.compile(r"(\w+)\[(.*?)\]\((.*?)\)(?: \+(.+))?")


def parse_layout(text: str, device: str = "cpu") -> Layout:
    """``float32[4, 8](8, 1)`` or ``float32[4](2) +3`` (an offset)."""
    m = _LAYOUT.fullmatch(text.strip())
    if m is None:
        raise IRParseError(f"bad layout {text!r}")
    offset = parse_index(m[4]) if m[4] else sympy.S.Zero
    return Layout(_dims(m[2]), _dims(m[3]), _dtype(m[1]), device, offset)


# ---- bodies: parsed to a raw tree first, then typed (dtypes flow up from loads, down to constants) ----

@dataclass(frozen=True)
class _Raw:
    kind: str  # "load" | "const" | "index" | "cast" | "op"
    name: str = ""  # buffer, op name or cast dtype
    value: object = None  # constant value or index expression
    args: tuple[_Raw, ...] = ()


_CONSTANTS = {"True": True, "False": False, "inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _raw_expr(text: str) -> _Raw:
    text = text.strip()
    if text in _CONSTANTS or re.fullmatch(r"-?\d+(\.\d*)?(e[-+]?\d+)?", text):
        return _Raw("const", value=_CONSTANTS[text] if text in _CONSTANTS else ast.literal_eval(text))
    m = re.fullmatch(r"(\w+)\[(.*)\]", text, re.S)
    if m and "(" not in m[1]:
        index, _, binds = m[2].partition(" | ")
        indirect = tuple(_raw_expr(b.partition("=")[2]) for b in _split_top(binds)) if binds else ()
        return _Raw("load", m[1], parse_index(index), indirect)
    m = re.fullmatch(r"(\w+)\((.*)\)", text, re.S)
    if m is None:
        raise IRParseError(f"bad expression {text!r}")
    if m[1] == "index":
        return _Raw("index", value=parse_index(m[2]))
    if m[1].startswith("to_"):
        return _Raw("cast", m[1][3:], args=(_raw_expr(m[2]),))
    if m[1] not in OPS:
        raise IRParseError(f"unknown op {m[1]!r} in {text!r}")
    return _Raw("op", m[1], args=tuple(_raw_expr(a) for a in _split_top(m[2])))


def _default(value: object) -> torch.dtype:
    return torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float32


class _Typer:
    """Assigns dtypes to a raw body, given the dtype of every buffer defined so far."""

    def __init__(self, dtypes: dict[str, torch.dtype]) -> None:
        self.dtypes = dtypes

    def natural(self, r: _Raw) -> torch.dtype | None:
        """The dtype ``r`` has whatever its context (None: a constant-like value that takes the context's)."""
        if r.kind == "load":
            return self._buffer(r.name)
        if r.kind == "cast":
            return _dtype(r.name)
        if r.kind != "op":
            return None
        kind = OPS[r.name].kind
        if kind in ("compare", "logical"):
            return torch.bool
        if kind == "random":
            return torch.float32
        operands = r.args[1:] if kind == "select" else r.args
        return self._common(operands)

    def _common(self, operands: tuple[_Raw, ...]) -> torch.dtype | None:
        found = [d for d in (self.natural(a) for a in operands) if d is not None]
        if not found:
            return None
        out = found[0]
        for d in found[1:]:
            out = torch.promote_types(out, d)
        return out

    def _weak(self, operands: tuple[_Raw, ...]) -> torch.dtype:
        """Operands that are all constants or index values: int64 with an index value, else the constants'."""
        if any(a.kind == "index" for a in operands):
            return torch.int64
        consts = [_default(a.value) for a in operands if a.kind == "const"]
        return torch.float32 if torch.float32 in consts or not consts else consts[0]

    def _buffer(self, name: str) -> torch.dtype:
        if name not in self.dtypes:
            raise IRParseError(f"loads {name!r} before it is defined")
        return self.dtypes[name]

    def expr(self, r: _Raw, expected: torch.dtype | None) -> Expr:
        if r.kind == "load":
            return Load(r.name, r.value, self._buffer(r.name),  # type: ignore[arg-type]
                        tuple(self.expr(a, torch.int64) for a in r.args))
        if r.kind == "const":
            return Constant(r.value, expected or _default(r.value))  # type: ignore[arg-type]
        if r.kind == "index":
            return IndexValue(r.value, expected or torch.int64)  # type: ignore[arg-type]
        if r.kind == "cast":
            return Cast(self.expr(r.args[0], None), _dtype(r.name))
        return self._op(r, expected)

    def _op(self, r: _Raw, expected: torch.dtype | None) -> Op:
        kind = OPS[r.name].kind
        if kind == "compare":
            inner = self._common(r.args) or self._weak(r.args)
            return Op(r.name, tuple(self.expr(a, inner) for a in r.args), torch.bool)
        if kind == "logical":
            return Op(r.name, tuple(self.expr(a, torch.bool) for a in r.args), torch.bool)
        if kind == "random":
            return Op(r.name, tuple(self.expr(a, torch.int64) for a in r.args), expected or torch.float32)
        if kind == "select":
            out = self._common(r.args[1:]) or expected or torch.float32
            cond = self.expr(r.args[0], torch.bool)
            return Op(r.name, (cond, *(self.expr(a, out) for a in r.args[1:])), out)
        out = self._common(r.args) or expected or torch.float32
        return Op(r.name, tuple(self.expr(a, out) for a in r.args), out)


# ---- nodes and programs ----------------------------------------------------------------------------

_HEAD = re.compile(r"(\w+): (.+?) = (.*)", re.S)


def _literal(text: str) -> object:
    if text.startswith("torch."):
        value = getattr(torch, text[len("torch."):], None)
        if value is None:
            raise IRParseError(f"unknown constant {text!r}")
        return value
    m = re.fullmatch(r"device\(type='(\w+)'(?:, index=(\d+))?\)", text)
    if m:
        return torch.device(m[1], int(m[2])) if m[2] else torch.device(m[1])
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise IRParseError(f"bad constant {text!r}") from e


_VIEW = re.compile(r"(\w+)\.view\(\[(.*?)\], \((.*?)\), \+(.+)\)")


class _Parser:
    def __init__(self, device: str) -> None:
        self.device = device
        self.dtypes: dict[str, torch.dtype] = {}

    def arg(self, text: str) -> Arg:
        m = _VIEW.fullmatch(text)
        if m:
            if m[1] not in self.dtypes:
                raise IRParseError(f"{text!r} refers to undefined buffer {m[1]!r}")
            return TensorRef(m[1], _dims(m[2]), _dims(m[3]), parse_index(m[4]), self.dtypes[m[1]])
        if text.startswith("[") and text.endswith("]"):
            return ListArg(tuple(self.arg(a) for a in _split_top(text[1:-1])))
        return ConstArg(_literal(text))

    def loop(self, name: str, layout: Layout, text: str) -> ComputedBuffer:
        typer = _Typer(self.dtypes)
        m = re.fullmatch(r"(pointwise|reduce_(\w+)|scan_(\w+)|scatter_(\w+))\[(.*?)\] (.*)", text, re.S)
        if m is None:
            raise IRParseError(f"bad loop node {text!r}")
        dims, rest = m[5], m[6]
        data: LoopData
        if m[1] == "pointwise":
            data = Pointwise(_dims(dims), typer.expr(_raw_expr(rest), layout.dtype))
        elif m[2]:
            ranges, _, red = dims.partition(" | ")
            arg = m[2] in ("argmax", "argmin")
            data = Reduction(_dims(ranges), _dims(red), m[2],
                             typer.expr(_raw_expr(rest), None if arg else layout.dtype))
        elif m[3]:
            ranges, _, axis = dims.partition(" axis=")
            data = Scan(_dims(ranges), int(axis), m[3], typer.expr(_raw_expr(rest), layout.dtype))
        else:
            data = self._scatter(m[4], dims, rest, layout, typer)
        return ComputedBuffer(name, layout, data)

    def _scatter(self, mode: str, dims: str, rest: str, layout: Layout, typer: _Typer) -> Scatter:
        m = re.fullmatch(r"(.*) then \[(.*?)\] at \[(.*?)\] (.*)", rest, re.S)
        if m is None:
            raise IRParseError(f"bad scatter {rest!r}")
        index, *binds = _split_top(m[3])
        indirect = tuple(typer.expr(_raw_expr(b.partition("=")[2]), torch.int64) for b in binds)
        return Scatter(_dims(dims), typer.expr(_raw_expr(m[1]), layout.dtype), _dims(m[2]), parse_index(index),
                       indirect, typer.expr(_raw_expr(m[4]), layout.dtype), mode)

    def extern(self, text: str) -> ExternKernel:
        m = re.fullmatch(r"(.*?) = (extern|fallback) ([\w.]+)\((.*)\)(?: holding \[(.*)\])?", text, re.S)
        if m is None:
            raise IRParseError(f"bad extern call {text!r}")
        args: list[Arg] = []
        kwargs: list[tuple[str, Arg]] = []
        for a in _split_top(m[4]):
            kw = re.match(r"(\w+)=(?!=)", a)
            if kw:
                kwargs.append((kw[1], self.arg(a[kw.end():])))
            else:
                args.append(self.arg(a))
        outs = []
        heads = _split_top(m[1]) if m[1] else []
        for k, head in enumerate(heads):
            name, _, layout = head.partition(": ")
            outs.append(ExternOutput(name, parse_layout(layout, self.device), () if len(heads) == 1 else (k,)))
        for o in outs:
            self.dtypes[o.buffer] = o.layout.dtype
        last = re.fullmatch(r"buf(\d+)", outs[-1].buffer) if outs else None
        name = f"{m[2]}{int(last[1]) + 1}" if last else m[2]
        holds = tuple(b.strip() for b in m[5].split(",")) if m[5] else ()
        return ExternKernel(name, m[3], tuple(args), tuple(kwargs), tuple(outs), m[2], holds)

    def node(self, line: str) -> Node | InputBuffer | str:
        """A program line: a node, an input, or the seed buffer's name."""
        m = _HEAD.fullmatch(line)
        if m is None or " = extern " in line or " = fallback " in line:
            return self.extern(line)
        name, layout, rest = m[1], parse_layout(m[2], self.device), m[3]
        if rest == "random seed":
            self.dtypes[name] = torch.int64
            return name
        if rest.startswith("input "):
            self.dtypes[name] = layout.dtype
            return InputBuffer(name, layout, int(rest[len("input "):]))
        node = self.loop(name, layout, rest)
        self.dtypes[name] = layout.dtype
        return node


def parse_program(text: str, device: str = "cpu") -> LoopProgram:
    """Read a ``LoopProgram.as_text()`` back (see the module's note on what is inferred)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# loop program "):
        raise IRParseError("a loop program starts with '# loop program NAME'")
    if not lines[-1].startswith("return (") or not lines[-1].endswith(")"):
        raise IRParseError(f"a loop program ends with 'return (...)', not {lines[-1]!r}")
    p = _Parser(device)
    inputs: list[InputBuffer] = []
    nodes: list[Node] = []
    seed: str | None = None
    for k, line in enumerate(lines[1:-1], start=2):
        try:
            item = p.node(line)
        except IRParseError as e:
            raise IRParseError(f"line {k}: {e}") from e
        if isinstance(item, InputBuffer):
            inputs.append(item)
        elif isinstance(item, str):
            seed = item
        else:
            nodes.append(item)
    outputs: list[Output] = []
    for a in _split_top(lines[-1][len("return ("):-1]):
        out = p.arg(a)
        if isinstance(out, ListArg):
            raise IRParseError(f"a program output is a buffer view or a constant, not {a!r}")
        outputs.append(out)
    return LoopProgram(lines[0][len("# loop program "):], tuple(inputs), tuple(nodes), tuple(outputs), seed)
