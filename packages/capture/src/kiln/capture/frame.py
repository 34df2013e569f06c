"""One interpreted frame: the stack, locals, cells, instruction pointer and the dispatch loop.

Opcode semantics live in the ``op_*`` modules (one per family) and are looked up in
``opcodes.HANDLERS``. The top frame of a capture stops at the first instruction that breaks the
graph and reports where (``BreakAt``); inlined frames let the break propagate to their caller.
"""

from __future__ import annotations

import dis
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import calls
from .errors import GraphBreak, user_location
from .opcodes import HANDLERS
from .sources import global_source
from .values import EMPTY, Cell
from .version import PY

if TYPE_CHECKING:
    from .knobs import CaptureOptions
    from .tracer import Tracer



@dataclass(frozen=True, slots=True)
class Inst:
    opname: str
    arg: int  # 0 for an instruction without an argument (dis says None)
    argval: Any
    argrepr: str
    offset: int
    lineno: int | None
    index: int
    where: str = ""  # file:line, for guard notes
    location: str = ""  # the same as a traceback line, for node metadata


@dataclass(frozen=True, slots=True)
class ExcEntry:
    start: int
    end: int
    target: int
    depth: int
    lasti: bool


_DECODED: dict[types.CodeType, tuple[list[Inst], dict[int, int], list[ExcEntry]]] = {}


def decode(code: types.CodeType) -> tuple[list[Inst], dict[int, int], list[ExcEntry]]:
    """The instructions of ``code`` (EXTENDED_ARG dropped), offset -> index, exception table."""
    hit = _DECODED.get(code)
    if hit is not None:
        return hit
    insts: list[Inst] = []
    index_of: dict[int, int] = {}
    pending: list[int] = []  # offsets of EXTENDED_ARG prefixes: jumps may target them
    # Note: each instruction's location texts, made once per line here rather than formatted on
    # every step (a capture steps through ~2x as many instructions as it decodes)
    lines: dict[int | None, tuple[str, str]] = {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("EXTENDED_ARG", "CACHE"):
            pending.append(ins.offset)
            continue
        lineno = ins.positions.lineno if ins.positions is not None else None
        for off in pending:
            index_of[off] = len(insts)
        pending.clear()
        index_of[ins.offset] = len(insts)
        texts = lines.get(lineno)
        if texts is None:
            texts = lines[lineno] = (f"{code.co_filename}:{lineno}",
                                     f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n')
        insts.append(Inst(ins.opname, ins.arg or 0, ins.argval, ins.argrepr, ins.offset, lineno, len(insts), *texts))
    entries = [ExcEntry(e.start, e.end, e.target, e.depth, e.lasti)
               for e in getattr(dis.Bytecode(code), "exception_entries", [])]
    _DECODED[code] = (insts, index_of, entries)
    return insts, index_of, entries


@dataclass
class Context:
    """What every frame of one capture shares."""

    tracer: Tracer
    options: CaptureOptions
    depth_limit: int
    root_code: types.CodeType
    # torch.autocast blocks entered for real and not yet left: a capture that stops inside one (a graph
    # break there runs the frame eagerly) leaves them on exit, or autocast would stay on after the call
    open_autocasts: list = field(default_factory=list)
    # constructions of torch.nn modules whose module outlived the graph in an earlier attempt at this
    # capture: they break the graph (module_init.py)
    escaping_builds: frozenset = frozenset()
    # generators made in the trace (generators.py), checked for cleanup a dropped one would run
    generators: list = field(default_factory=list)
    spawned: int = 0  # frames inlined so far (size_one_branch.py: an arm that inlines a call is not neutral)


@dataclass
class FrameResult:
    value: Any = None
    returned: bool = False


@dataclass
class BreakAt:
    """Where the top frame stopped: the instruction, the stack and locals before it, and why."""

    inst: Inst
    stack: list
    locals: dict[str, Any]
    cells: dict[str, Cell]
    kw_names: tuple | None
    reason: str
    user_stack: list[str] = field(default_factory=list)


class Frame:
    def __init__(self, ctx: Context, code: types.CodeType, f_globals: dict[str, Any],
                 locals_: dict[str, Any], closure: tuple[Cell, ...], parent: Frame | None) -> None:
        self.ctx = ctx
        self.tracer = ctx.tracer
        self.code = code
        self.f_globals = f_globals
        self.f_builtins: dict[str, Any] = f_globals.get("__builtins__", __builtins__)  # type: ignore[assignment]
        if isinstance(self.f_builtins, types.ModuleType):
            self.f_builtins = self.f_builtins.__dict__
        self.locals = locals_
        self.cells: dict[str, Cell] = {}
        for name, cell in zip(code.co_freevars, closure):
            self.cells[name] = cell
        if PY < (3, 11):
            raise NotImplementedError("kiln.capture needs Python 3.11+")
        self.insts, self.index_of, self.exc_table = decode(code)
        self.stack: list[Any] = []
        self.ip = 0
        self.kw_names: tuple | None = None
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.result = FrameResult()
        self.is_generator = bool(code.co_flags & inspect.CO_GENERATOR)
        self.suspended = False  # a generator's frame stopped at a yield (generators.py)
        self.yielded: Any = None
        self.exc_stack: list[Any] = []
        self.current: Inst | None = None

    # ---- stack helpers ------------------------------------------------------------------
    def push(self, v: Any) -> None:
        self.stack.append(v)

    def pop(self) -> Any:
        return self.stack.pop()

    def popn(self, n: int) -> list[Any]:
        if n == 0:
            return []
        vals = self.stack[-n:]
        del self.stack[-n:]
        return vals

    def jump(self, offset: int) -> None:
        self.ip = self.index_of[offset]

    def location(self) -> str:
        return user_location(self.code, self.current.lineno if self.current else None)

    def is_top(self) -> bool:
        return self.parent is None

    # ---- the loop -----------------------------------------------------------------------
    def step(self, inst: Inst) -> None:
        handler = HANDLERS.get(inst.opname)
        if handler is None:
            raise GraphBreak(f"unsupported bytecode {inst.opname}",
                             "this Python construct is not supported by kiln.capture yet")
        self.current = inst
        self.tracer.where = inst.where
        self.tracer.location = inst.location
        self.ip = inst.index + 1
        handler(self, inst)

    def run_inlined(self) -> Any:
        """Run to RETURN (or, in a generator's frame, to its next yield); a graph break propagates
        with this frame's location on its stack."""
        while not self.result.returned and not self.suspended:
            inst = self.insts[self.ip]
            try:
                self.step(inst)
            except GraphBreak as e:
                e.user_stack.append(user_location(self.code, inst.lineno))
                raise
            except Exception as e:
                if not self.handle_exception(e, inst):
                    raise
        return self.result.value

    def run_top(self) -> FrameResult | BreakAt:
        while not self.result.returned:
            inst = self.insts[self.ip]
            saved = (list(self.stack), dict(self.locals), self.kw_names,
                     {k: (c, c.value) for k, c in self.cells.items()})
            cp = self.tracer.checkpoint()
            try:
                self.step(inst)
            except GraphBreak as e:
                self.tracer.rollback(cp)
                stack, locals_, kw, cells = saved
                for c, v in cells.values():
                    c.value = v
                e.user_stack.append(user_location(self.code, inst.lineno))
                return BreakAt(inst, stack, locals_, dict(self.cells), kw, e.reason + (
                    f" (hint: {e.hint})" if e.hint else ""), list(e.user_stack))
            except Exception as e:
                if not self.handle_exception(e, inst):
                    raise
        return self.result

    def handle_exception(self, exc: BaseException, inst: Inst) -> bool:
        """Jump to the handler covering ``inst`` (CPython 3.11+ exception table), if any."""
        for entry in self.exc_table:
            if entry.start <= inst.offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(inst.offset)
                self.push(exc)
                self.jump(entry.target)
                return True
        return False

    # ---- calls ----------------------------------------------------------------------------
    def call(self, fn: Any, args: list, kwargs: dict) -> Any:
        return calls.call_function(self, fn, args, kwargs)

    def spawn(self, code: types.CodeType, f_globals: dict[str, Any], bound: dict[str, Any],
              closure: tuple[Cell, ...]) -> Frame:
        self.ctx.spawned += 1
        return Frame(self.ctx, code, f_globals, bound, closure, parent=self)

    # ---- names --------------------------------------------------------------------------
    def load_global(self, name: str) -> Any:
        if name in self.f_globals:
            value = self.f_globals[name]
            if self.f_globals is self.ctx_globals():
                return self.tracer.wrap(value, global_source(name))
            if isinstance(value, (types.FunctionType, type, types.ModuleType, types.BuiltinFunctionType)):
                return value  # library functions and classes are assumed stable
            return self.tracer.wrap(value, self._foreign_global_source(name))
        if name in self.f_builtins:
            return self.f_builtins[name]
        raise NameError(f"name {name!r} is not defined")

    def ctx_globals(self) -> dict[str, Any]:
        root = self
        while root.parent is not None:
            root = root.parent
        return root.f_globals

    def _foreign_global_source(self, name: str) -> str | None:
        """Globals of an inlined function from another module: reach them through sys.modules."""
        mod = self.f_globals.get("__name__")
        if isinstance(mod, str) and sys.modules.get(mod) is not None and \
                getattr(sys.modules[mod], "__dict__", None) is self.f_globals:
            return f"__import__('sys').modules[{mod!r}].{name}" if name.isidentifier() else None
        return None

    def cell(self, name: str) -> Cell:
        c = self.cells.get(name)
        if c is None:
            c = self.cells[name] = Cell(self.locals.pop(name, EMPTY))
        return c
