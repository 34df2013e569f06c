"""The Python wrapper: a readable module that allocates buffers, launches kernels and extern calls in
the planned order, frees buffers after their last use, and returns the outputs.

The module is self-contained (torch + ctypes): it defines ``call(args: list) -> tuple`` and reads
``FILES_DIR`` for compiled kernels, so kiln.runtime can save and load it without the compiler.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import sympy
import torch

from kiln.graph import ATTENTION_BACKWARD_TARGET, ATTENTION_SOURCE, ATTENTION_TARGET

from ..graph_passes.pad_matmuls import MM_PADDED_SOURCE
from ..ir import (
    WAIT_TENSOR,
    Arg,
    ConstArg,
    ExternKernel,
    Kernel,
    KernelGroup,
    Layout,
    ListArg,
    LoopProgram,
    ScheduledProgram,
    SymScalar,
    TensorRef,
    contiguous_strides,
    issues_collective,
    product,
    python_scalar,
)
from ..scheduler.arena import CONVOLUTION, OUT_FORMS, ArenaPlan, plan_arena
from .common import CompiledKernels, input_last_uses
from .empty_attention import EMPTY_ATTENTION, empty_check, fill_value
from .triton.printer import python_index

# The constant helpers (``_restride``, the extern-call table's callers, the C++ library loader) live in
# kiln.runtime.program_helpers: imported (Python caches its bytecode) instead of compiled with every
# artifact a new process loads (~0.4 ms of compile() per wrapper).
HEADER = '''"""kiln.inductor generated wrapper for graph {name!r}."""
import ctypes
import math
import os

import torch
from kiln.runtime.program_helpers import restride as _restride

aten = torch.ops.aten
inf, nan = float("inf"), float("nan")
'''

# Extern calls with one plain output, when their trailing arguments are constants: one short statement
# each (``buf3 = _ext(torch.convolution, 7, buf2, arg6)``) with the constants, size and stride in a
# table read from one JSON string. Why: compile() of the wrapper at every artifact load grows with
# its expressions (a convolution's statement carries ~30 constants, each an expression to compile);
# per call it is one Python frame, as ``_restride`` was, and no argument lists built. ``_ext2``/
# ``_ext3`` (mm, bmm, addmm, a convolution) also take their tensor arguments' views from the row
# (``(shape, stride, offset)`` or None per argument): two ``x.as_strided((..), (..), x.storage_offset())``
# per mm dominate a transformer wrapper's compile() time otherwise; per call the same as_strided calls run.
# The callers are closures over the table (kiln.runtime.program_helpers.ext_callers).
EXT_TABLE = "\nfrom kiln.runtime.program_helpers import ext_callers as _ext_callers\n_EXT, _ext, _ext2, _ext3 = _ext_callers({table!r})\n"

# what a wrapper's ``requires`` lists besides torch: the helpers above
REQUIRES = ("torch", "kiln.runtime")


# torch's generated Python bindings take the same arguments as these overloads and skip the
# OpOverload's boxed call: 13.8 instead of 19.5 us of host time per addmm on the H200's host
# (benchmarks/host_probe.py); a step of a transformer makes ~60 such calls
_DIRECT = {f"aten.{op}.default": f"torch.{op}" for op in ("mm", "addmm", "bmm", "baddbmm", "convolution")}
# kiln's own ops run as functions the module defines: a saved program needs no kiln import
_HELPERS = {"kiln_inductor.mm_padded.default": "_mm_padded", ATTENTION_TARGET: "_kiln_attention",
            ATTENTION_BACKWARD_TARGET: "_kiln_attention_backward"}
_HELPER_SOURCES = {"kiln_inductor.mm_padded.default": MM_PADDED_SOURCE, ATTENTION_TARGET: ATTENTION_SOURCE,
                   ATTENTION_BACKWARD_TARGET: ATTENTION_SOURCE}
_DIRECT.update(_HELPERS)
# ATen's matmuls return fresh contiguous tensors (a dense strided result of the output's shape): a
# planned contiguous layout needs no re-striding check after them (one Python call less per matmul)
_CONTIGUOUS_RESULT = frozenset(f"aten.{op}.default" for op in ("mm", "addmm", "bmm", "baddbmm"))


# ``mm(x, w.T)`` / ``addmm(b, x, w.T)`` over a weight ``w`` stored [out, in] (every nn.Linear): called as
# ``linear(x, w[, b])``, which makes the same ATen call with the transpose taken in C++: one Python-level
# ``as_strided`` less per matmul (~1.3 us of host time on the H200's host; a 24-layer decoder makes ~170
# per token)
LINEAR = "from torch.nn.functional import linear as _linear\n"
_MM, _ADDMM = "aten.mm.default", "aten.addmm.default"

# the helpers an arena program calls (kiln.runtime.program_helpers), imported only where used
CONV_OUT = "from kiln.runtime.program_helpers import conv_out as _conv_out\n"
TAKE_ARENA = "from kiln.runtime.program_helpers import take_arena as _take_arena\n"


# ``call`` keeps the caller's list as it is; ``call_owned`` takes the caller's references over (it
# empties the list) and drops each input after its last use
CALL_OWNED = """

def call(args):
    return call_owned(list(args))


def call_owned(args):"""


def _int(x: Any) -> str:
    """A size as Python: the integer, or the expression over the call's size symbols."""
    return str(int(x)) if isinstance(x, (int, sympy.Integer)) else python_index(x)


def _ints(xs: tuple) -> str:
    items = ", ".join(_int(x) for x in xs)
    return f"({items},)" if len(xs) == 1 else f"({items})"


def _static(*xs: Any) -> bool:
    return all(isinstance(x, (int, sympy.Integer)) for x in xs)


# symbolic sizes: the helper that raises when a call's sizes break a relation the compile assumed
GUARD_ERROR = "from kiln.runtime import GuardError as _GuardError\n"


_JSON_SCALARS = (bool, int, str, type(None))


class _Symbolic(Exception):
    """An extern's operand view has symbolic sizes: it cannot go in the JSON table."""


def _json_const(a: Arg) -> bool:
    """A constant argument that JSON gives back as the same Python value (lists stay lists)."""
    if isinstance(a, ConstArg):
        v = a.value
        return type(v) in _JSON_SCALARS or (type(v) is float and v == v and abs(v) != float("inf"))
    return isinstance(a, ListArg) and all(_json_const(x) for x in a.items)


def _json_value(a: Arg) -> Any:
    return [_json_value(x) for x in a.items] if isinstance(a, ListArg) else a.value  # type: ignore[union-attr]


_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def _value(v: Any) -> str:
    if isinstance(v, sympy.Expr):  # a symbolic size argument
        return _int(v)
    if isinstance(v, SymScalar):  # a symbolic float: computed here from the call's sizes
        return python_scalar(v, _int)
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, torch.memory_format):
        return str(v)
    if isinstance(v, torch.layout):
        return str(v)
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return repr(v)
    return repr(v)


class WrapperWriter:
    def __init__(self, s: ScheduledProgram, kernels: CompiledKernels, arena: bool = False,
                 shared_views: frozenset[tuple] = frozenset()) -> None:
        self.s = s
        p = s.program
        assert isinstance(p, LoopProgram)
        self.p = p
        self.kernels = kernels
        self.layouts = p.layouts()
        # the program's intermediate buffers at planned offsets of one allocation per call
        # (scheduler/arena.py); None: one allocator block per buffer
        self.arena: ArenaPlan | None = None
        if arena and not p.sizes:  # symbolic sizes: one allocator block per buffer (sizes vary per call)
            plan = plan_arena(s)
            self.arena = plan if plan.offsets else None
        self.lines: list[str] = []
        self.device = getattr(kernels, "device", "cpu")
        self.device_kw = "" if self.device == "cpu" else f", device={self.device!r}"
        self.imports: list[str] = []  # module-level lines the steps turned out to need (helpers above)
        # a buffer that takes over another's memory with the same layout is the same tensor: it
        # keeps the first name (no statement, nothing to compile at load, nothing to run per call)
        self.alias: dict[str, str] = {}
        self.note = ""  # a comment for the next statement (where an alias was made)
        self.ext_rows: list[list[Any]] = []
        # names whose last use is behind: unbound by one ``del`` just before the next statement that
        # may allocate (not before a kernel launch, which allocates nothing), so the memory is free
        # for it as before, with fewer statements to compile at load and to run per call
        self.pending_dels: list[str] = []
        # Note: kernels take their buffers by pointer (C++: ``data_ptr()``; Triton: the tensor, of which
        # it reads the pointer and dtype), never by shape. So the tensor a name is bound to need not
        # have the buffer's planned shape: a buffer that takes over another's memory is that tensor
        # (no ``as_strided`` per call), and a fresh buffer whose only extern use is one dense view of
        # it (a matmul's 2-D view of a 3-D activation) is allocated in that view's shape. ``bound``
        # records the (shape, stride) of the tensor behind each name where it differs from the planned
        # layout (always at the buffer's own storage offset); externs and outputs get a view only
        # where that differs from what they need.
        self.bound: dict[str, tuple[tuple, tuple]] = {}
        self.extern_views = _extern_views(s)
        # a view that extern calls take of one tensor more than once (a transformer's residual stream
        # as each projection's 2-D operand) is made once, bound to a name, and unbound with its tensor.
        # Which views repeat is known after a first writing (names are resolved through ``alias`` as
        # the steps are written): ``view_uses`` counts them, ``wrapper_source`` writes again with them.
        self.shared_views = shared_views
        self.view_uses: Counter[tuple] = Counter()
        self.view_names: dict[tuple, str] = {}  # (tensor name, shape, stride, offset) -> bound name
        self.views_of: dict[str, list[str]] = {}  # tensor name -> the names of its bound views
        self.bind_views = True  # False while statements go inside a branch (a name bound there may be unset)

    def free(self, names: list[str]) -> None:
        self.pending_dels += names
        for n in names:  # a bound view keeps its tensor's memory: unbound with it
            self.pending_dels += self.views_of.pop(self.alias.get(n, n), [])

    def emit(self, line: str, *, allocates: bool = True) -> None:
        """Append a statement of ``call_owned``, its buffer names read through the aliases."""
        if allocates and self.pending_dels:
            dels, self.pending_dels = self.pending_dels, []
            self.emit(f"    del {', '.join(dels)}")
        if self.alias:
            line = _NAME.sub(lambda m: self.alias.get(m.group(0), m.group(0)), line)
        if self.note:
            line = f"{line}  # {self.note}" if "  # " not in line else f"{line}; {self.note}"
            self.note = ""
        self.lines.append(line)

    def shape_of(self, buffer: str) -> tuple[tuple, tuple]:
        """(shape, stride) of the tensor ``buffer``'s name is bound to (through aliases)."""
        name = self.alias.get(buffer, buffer)
        got = self.bound.get(name)
        if got is not None:
            return got
        lay = self.layouts[name]
        return tuple(lay.shape), tuple(lay.stride)

    def ref(self, r: TensorRef, *, shared: bool = True) -> str:
        """``r`` as an expression: its tensor's name, or a view of it (a bound name for a view taken
        more than once, when ``shared``)."""
        lay = self.layouts[r.buffer]
        if (tuple(r.shape), tuple(r.stride)) == self.shape_of(r.buffer) and r.offset == lay.offset:
            return r.buffer
        off = _int(r.offset)
        # as_strided keeps the tensor's storage offset when given none (one call less)
        offset = f", {r.buffer}.storage_offset() + {off}" if off != "0" else ""
        view = f"{r.buffer}.as_strided({_ints(r.shape)}, {_ints(r.stride)}{offset})"
        key = self.view_key(r)
        if not shared or key not in self.shared_views:
            return view
        name = self.view_names.get(key)
        if name is None:
            if not self.bind_views:
                return view
            base = key[0]
            name = self.view_names[key] = f"{base}_v{len(self.views_of.get(base, []))}"
            self.views_of.setdefault(base, []).append(name)
            self.emit(f"    {name} = {view}")
        return name

    def view_key(self, r: TensorRef) -> tuple:
        """``r``'s view as (the name of the tensor it views, through the aliases, shape, stride, offset)."""
        return (self.alias.get(r.buffer, r.buffer), tuple(r.shape), tuple(r.stride), r.offset)

    def view(self, a: Arg) -> list | None:
        """A tensor argument's view of its buffer as a table entry ``[shape, stride, offset]``
        (offset relative to the buffer's own); None when it is the buffer as planned, a bound view
        or no tensor."""
        if not isinstance(a, TensorRef):
            return None
        expr = self.ref(a)
        if expr in (a.buffer, self.view_names.get(self.view_key(a))):
            return None
        if not _static(*a.shape, *a.stride, a.offset):
            raise _Symbolic
        return [[int(x) for x in a.shape], [int(x) for x in a.stride], int(a.offset)]

    def arg(self, a: Arg) -> str:
        if isinstance(a, TensorRef):
            self.view_uses[self.view_key(a)] += 1
            return self.ref(a)
        if isinstance(a, ListArg):
            return "[" + ", ".join(self.arg(x) for x in a.items) + "]"
        assert isinstance(a, ConstArg)
        return _value(a.value)

    def extern(self, e: ExternKernel, dead: frozenset[str] = frozenset()) -> None:
        """The call (``call_extern``); for an attention kernel that may see an empty sequence, behind a
        branch that makes its outputs instead (empty_attention.py)."""
        check = empty_check(e)
        if check is None:
            self.call_extern(e, dead)
            return
        if not check.always:
            cond = " or ".join(f"{_int(s)} == 0" for s in check.sizes)
            self.emit(f"    if not ({cond}):")
            start = len(self.lines)
            self.bind_views = False
            self.call_extern(e, dead)
            self.bind_views = True
            self.lines[start:] = ["    " + line for line in self.lines[start:]]
            self.emit("    else:  # an empty query or key sequence: the kernel is not called", allocates=False)
        q = e.args[EMPTY_ATTENTION[e.target].query]
        assert isinstance(q, TensorRef)
        pad = "        " if not check.always else "    "
        for o in e.outputs:
            if o.buffer in dead:
                continue
            lay = o.layout
            self.emit(f"{pad}{o.buffer} = torch.empty_strided({_ints(lay.shape)}, {_ints(lay.stride)}, "
                      f"dtype={lay.dtype}, device={q.buffer}.device).fill_({fill_value(e, o)!r})", allocates=False)

    def call_extern(self, e: ExternKernel, dead: frozenset[str] = frozenset()) -> None:
        """The call, then each used output re-strided to its planned layout (one statement for a call
        with one plain output, the common case: fewer statements to compile at load). ``dead`` outputs (freed in
        the same step: cuDNN attention's logsumexp and philox state in inference) are never bound:
        ATen may return undefined tensors (None) for them. An output planned in the arena is written
        there through the op's ``out=`` form."""
        ns, op, overload = e.target.split(".", 2)
        into_arena = self.arena is not None and e.outputs[0].buffer in self.arena.offsets
        linear = None if into_arena else self.linear_args(e)
        args = e.args if linear is None else linear
        call_args = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in e.kwargs]
        if into_arena:
            o = e.outputs[0]
            self.emit(f"    {o.buffer} = {self.arena_view(o.buffer, o.layout)}")
            if e.target == CONVOLUTION:
                if CONV_OUT not in self.imports:
                    self.imports.append(CONV_OUT)
                self.emit(f"    {o.buffer} = _conv_out({', '.join(call_args)}, {o.buffer})  # {e.kind} {e.target}, "
                          "into the arena", allocates=False)
            else:
                self.emit(f"    {OUT_FORMS[e.target]}({', '.join(call_args)}, out={o.buffer})  # {e.kind} "
                          f"{e.target}, into the arena", allocates=False)
            return
        target = _DIRECT.get(e.target, f"torch.ops.{ns}.{op}.{overload}")
        if linear is not None:
            target = "_linear"
            if LINEAR not in self.imports:
                self.imports.append(LINEAR)
        res = f"_r_{e.name}" if (len(e.outputs) != 1 or e.outputs[0].path) else e.outputs[0].buffer
        note = e.kind if target.startswith("torch.ops.") else f"{e.kind} {e.target}"
        call = f"{target}({', '.join(call_args)})"
        if issues_collective(e.target) or e.target == WAIT_TENSOR:
            self.collective(e, res, call)
            return
        if not res.startswith("_r_"):  # one plain output: re-strided in the same statement (less to compile)
            o = e.outputs[0]
            views = None
            if not e.kwargs and _static(*o.layout.shape, *o.layout.stride):
                cut = len(args)
                while cut > 0 and _json_const(args[cut - 1]):
                    cut -= 1
                try:
                    views = [self.view(a) for a in args[:cut]]
                except _Symbolic:  # a symbolic view of an operand: the plain call below
                    views = None
            if views is not None:
                row: list[list[Any] | None] = [[_json_value(a) for a in args[cut:]],
                       [int(x) for x in o.layout.shape], [int(x) for x in o.layout.stride]]
                helper = "_ext"
                if cut in (2, 3) and any(v is not None for v in views):
                    helper = f"_ext{cut}"
                    row += views
                    call_args[:cut] = [a.buffer if v is not None else c  # type: ignore[union-attr]
                                       for a, v, c in zip(args, views, call_args)]
                self.ext_rows.append(row)
                lead = "".join(f", {a}" for a in call_args[:cut])
                self.emit(f"    {res} = {helper}({target}, {len(self.ext_rows) - 1}{lead})  # {note}")
                return
            if e.target in _CONTIGUOUS_RESULT and _dense(tuple(o.layout.shape), tuple(o.layout.stride)):
                self.emit(f"    {res} = {call}  # {note}")
                return
            self.emit(f"    {res} = _restride({call}, {_ints(o.layout.shape)}, {_ints(o.layout.stride)})"
                      f"  # {note}")
            return
        self.emit(f"    {res} = {call}  # {note}")
        for o in e.outputs:
            if o.buffer in dead and res.startswith("_r_"):
                continue
            src = res + "".join(f"[{k}]" for k in o.path)
            # externs too, not only fallbacks: the kernels index by the traced strides, which a
            # convolution (its input's layout) or cuDNN need not return
            where = f", {o.layout.dtype}, {o.layout.device!r}" if o.path else ""
            src = f"_restride({src}, {_ints(o.layout.shape)}, {_ints(o.layout.stride)}{where})"
            self.emit(f"    {o.buffer} = {src}")
        if res.startswith("_r_"):
            self.emit(f"    del {res}")

    def linear_args(self, e: ExternKernel) -> tuple[Arg, ...] | None:
        """``(x, w)`` / ``(x, w, b)`` for ``linear`` when ``e`` is ``mm(x, w.T)`` / ``addmm(b, x, w.T)``
        (no other arguments) over the tensor bound to ``w``'s name, stored [n, k] row-major (LINEAR);
        else None."""
        if e.kwargs or (e.target, len(e.args)) not in ((_MM, 2), (_ADDMM, 3)):
            return None
        w = e.args[-1]
        if not isinstance(w, TensorRef) or w.offset != self.layouts[w.buffer].offset:
            return None
        shape, stride = self.shape_of(w.buffer)
        if len(shape) != 2 or stride != (shape[1], 1) or tuple(w.shape) != shape[::-1] \
                or tuple(w.stride) != (1, shape[1]):
            return None
        plain = TensorRef(w.buffer, shape, stride, w.offset, w.dtype)
        return (e.args[0], plain) if e.target == _MM else (e.args[1], plain, e.args[0])

    def collective(self, e: ExternKernel, res: str, call: str) -> None:
        """A collective or its wait, its outputs bound as they are: the wait finds its work by the
        tensor the collective returned, and a copy (``_restride``) before the wait would read memory
        the communication is still writing. Their fresh outputs have the traced (contiguous) layout."""
        self.emit(f"    {res} = {call}  # {e.kind}")
        if res.startswith("_r_"):
            for o in e.outputs:
                self.emit(f"    {o.buffer} = {res}{''.join(f'[{k}]' for k in o.path)}")
            self.emit(f"    del {res}")

    def take_arena(self) -> None:
        """The call's first statements: the arena (carved from a block with a tail while a CUDA graph
        records, see scheduler/arena.py), one view of it per dtype its buffers have."""
        assert self.arena is not None
        a = self.arena
        note = f"  # {len(a.offsets)} buffers; most live at once: {a.live_peak} bytes"
        if a.tail and self.device != "cpu":
            self.imports.append(TAKE_ARENA)
            self.lines.append(f"    _arena = _take_arena({a.size}, {a.tail}, {self.device!r}){note}")
        else:
            self.lines.append(f"    _arena = torch.empty(({a.size},), dtype=torch.uint8{self.device_kw}){note}")
        for dt in sorted({self.layouts[b].dtype for b in a.roots}, key=str):
            self.lines.append(f"    {self._arena_name(dt)} = _arena.view({dt})")
        self.lines.append("    del _arena")

    def arena_view(self, buffer: str, layout: Layout) -> str:
        """The arena's bytes at ``buffer``'s planned offset as a tensor of its layout (through one view
        of the arena per dtype, made at the start of the call)."""
        assert self.arena is not None
        item = torch.empty((), dtype=layout.dtype).element_size()
        at = self.arena.offsets[self.arena.roots[buffer]] // item
        return f"{self._arena_name(layout.dtype)}.as_strided({_ints(layout.shape)}, {_ints(layout.stride)}, {at})"

    @staticmethod
    def _arena_name(dtype: torch.dtype) -> str:
        return f"_arena_{str(dtype).removeprefix('torch.')}"

    def alloc(self, buffer: str, layout: Layout, reuse: str | None) -> None:
        self.bound.pop(buffer, None)
        if self.arena and buffer in self.arena.offsets:
            if reuse:  # the memory plan's hand-over, planned anew in the arena
                self.free([reuse])
            self.emit(f"    {buffer} = {self.arena_view(buffer, layout)}")
            return
        if self.arena and reuse and reuse in self.arena.roots and buffer not in self.arena.roots:
            self.free([reuse])  # an escaping buffer (an output) never takes arena memory
            reuse = None
        if reuse:  # the same tensor under a second name: no statement (kernels take its pointer)
            self.alias[buffer] = self.alias.get(reuse, reuse)
            self.note = (f"{self.note}, " if self.note else "") + f"reuse: {buffer} is {self.alias[buffer]}"
            return
        shape, stride = self.alloc_shape(buffer, layout)
        if (shape, stride) != (tuple(layout.shape), tuple(layout.stride)):
            self.bound[buffer] = (shape, stride)
        self.emit(f"    {buffer} = torch.empty_strided({_ints(shape)}, {_ints(stride)}, dtype={layout.dtype}"
                  f"{self.device_kw})")

    def alloc_shape(self, buffer: str, layout: Layout) -> tuple[tuple, tuple]:
        """The shape to allocate ``buffer`` in: its externs' one view of it when that view is dense over
        the same elements as the planned (dense) layout, so no extern needs a view of it; else planned."""
        planned = (tuple(layout.shape), tuple(layout.stride))
        views = self.extern_views.get(buffer)
        if not views or len(views) != 1:
            return planned
        (shape, stride, offset, dtype), = views
        if (offset != 0 or dtype != layout.dtype or layout.offset != 0 or not _dense(*planned)
                or not _dense(shape, stride) or sympy.expand(product(shape) - product(planned[0])) != 0):
            return planned
        return shape, stride

    def size_prologue(self) -> None:
        """Symbolic sizes: every size symbol read from the inputs, then the relations the compile
        assumed checked (a GuardError names the one that fails)."""
        p = self.p
        for z in p.sizes:
            self.lines.append(f"    {z.symbol} = {z.source}")
        if p.size_guards:
            self.imports.append(GUARD_ERROR)
            sizes = ", ".join(f"{z.symbol}={{{z.symbol}}}" for z in p.sizes)
            for g in p.size_guards:
                msg = f"graph {p.name!r} was compiled for sizes with {g.expr} ({g.reason}); called with {sizes}"
                self.lines.append(f"    if not ({g.expr}):")
                self.lines.append(f"        raise _GuardError(f{msg!r})")

    def write(self) -> str:
        p = self.p
        reused = {a.reuse for st in self.s.steps for a in st.allocate if a.reuse}
        self.lines.append(HEADER.format(name=p.name))
        used = {st.work.target for st in self.s.steps if isinstance(st.work, ExternKernel)}
        self.lines.extend(dict.fromkeys(src for target, src in _HELPER_SOURCES.items() if target in used))
        if self.kernels.prelude:
            self.lines.append(self.kernels.prelude)
        tables = len(self.lines)  # the imports and the extern table go here once the steps are written
        self.lines.append(CALL_OWNED)
        names = {b.position: b.name for b in p.inputs} | {k: f"arg{k}" for k in p.scalar_inputs}
        unpack = [names.get(k, "_") for k in range(max(names, default=-1) + 1)]
        if unpack:
            self.lines.append(f"    {', '.join(unpack)}{',' if len(unpack) == 1 else ''} = args[:{len(unpack)}]")
        self.lines.append("    args.clear()")
        self.size_prologue()
        input_dels = input_last_uses(self.s, reused)
        if input_dels.get(-1):
            self.lines.append(f"    del {', '.join(input_dels[-1])}")
        if self.kernels.call_prologue:
            self.lines.append(f"    {self.kernels.call_prologue}")
        if self.arena:
            self.take_arena()
        if p.seed_buffer:
            self.lines.append(f"    {p.seed_buffer} = torch.randint(0, 2**62, (1,), dtype=torch.int64{self.device_kw})")
        for k, st in enumerate(self.s.steps):
            # outputs written over an input the launch still names (Triton takes the tensor as its input
            # and its output pointer; C++ takes it once): both names stay bound through the launch
            work = st.work
            launch = self.kernels.launches[work.name] if isinstance(work, (Kernel, KernelGroup)) else ""
            over = {o: i for o, i in work.inplace if re.search(rf"\b{i}\b", launch)} \
                if launch and isinstance(work, (Kernel, KernelGroup)) else {}
            for a in st.allocate:
                if over.get(a.buffer) == a.reuse and a.reuse is not None:
                    # the input may have another shape over the same memory (inplace.py): the kernel
                    # takes its pointer, externs and outputs view it as they need (``ref``)
                    self.bound[a.buffer] = self.shape_of(a.reuse)
                    self.emit(f"    {a.buffer} = {a.reuse}  # written in place")
                else:
                    self.alloc(a.buffer, a.layout, a.reuse)
            dead: frozenset[str] = frozenset()
            if isinstance(st.work, (Kernel, KernelGroup)):
                self.emit(f"    {launch}", allocates=False)
                if over:
                    self.free(list(over.values()))
            else:
                dead = frozenset(o.buffer for o in st.work.outputs
                                 if o.buffer in st.free and o.buffer not in reused and o.path)
                self.extern(st.work, dead)
            dels = [b for b in st.free if b not in reused and b not in dead] + input_dels.get(k, [])
            self.free(dels)
        outs = []
        for o in p.outputs:
            outs.append(self.ref(o, shared=False) if isinstance(o, TensorRef) else _value(o.value))
        self.pending_dels.clear()  # returning unbinds them all at once
        self.emit(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        body = tables + 1  # the lines of ``call_owned`` (the imports go in at ``tables`` below)
        self.lines[body:] = _pointers_read_once(self.lines[body:])
        if self.ext_rows:
            self.imports.append(EXT_TABLE.format(table=json.dumps(self.ext_rows, separators=(",", ":"))))
        self.lines[tables:tables] = self.imports
        return "\n".join(self.lines) + "\n"


def _dense(shape: tuple, stride: tuple) -> bool:
    """Whether a layout is the row-major contiguous one of its shape (exactly, as expressions)."""
    return all(sympy.expand(a - b) == 0 for a, b in zip(stride, contiguous_strides(shape)))


def _tensor_refs(a: Arg) -> list[TensorRef]:
    if isinstance(a, TensorRef):
        return [a]
    if isinstance(a, ListArg):
        return [r for x in a.items for r in _tensor_refs(x)]
    return []


def _extern_views(s: ScheduledProgram) -> dict[str, set[tuple]]:
    """Buffer -> the views ``(shape, stride, offset, dtype)`` extern calls take of it; graph outputs and
    buffers a collective or wait holds are left out (they keep their planned shape)."""
    p = s.program
    views: dict[str, set[tuple]] = {}
    pinned = {o.buffer for o in p.outputs if isinstance(o, TensorRef)}
    for st in s.steps:
        if not isinstance(st.work, ExternKernel):
            continue
        e = st.work
        if issues_collective(e.target) or e.target == WAIT_TENSOR:
            pinned.update(r.buffer for a in (*e.args, *(v for _, v in e.kwargs)) for r in _tensor_refs(a))
            pinned.update(e.holds)
            continue
        for a in (*e.args, *(v for _, v in e.kwargs)):
            for r in _tensor_refs(a):
                views.setdefault(r.buffer, set()).add((tuple(r.shape), tuple(r.stride), r.offset, r.dtype))
    return {b: v for b, v in views.items() if b not in pinned}


_DATA_PTR = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.data_ptr\(\)")


def _pointers_read_once(lines: list[str]) -> list[str]:
    """``call_owned``'s statements with each tensor's ``data_ptr()`` read once when C++ kernel launches
    take it more than once (a buffer one kernel writes and the next reads; an optimizer step's state
    tensors, read by two kernels: 290 reads of 160 inputs, ~0.06 us each): bound to ``_p<name>`` before
    its first launch. Only for names whose every read is a top-level statement and that no statement
    between the first read and the last rebinds or resizes (a tensor's memory stays put otherwise: the
    wrapper writes inputs in place only through their own pointer)."""
    uses: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        for name in dict.fromkeys(_DATA_PTR.findall(line)):
            uses.setdefault(name, []).append(i)
    hoist: dict[int, list[str]] = {}  # line index -> names bound just before it
    shared: set[str] = set()
    for name, at in uses.items():
        if len(at) < 2 or not all(_top_level(lines[i]) for i in at):
            continue
        between = lines[at[0]:at[-1] + 1]
        rebind = re.compile(rf"^\s*(?:[\w\s,]*\b{re.escape(name)}\b[\w\s,]*=(?!=)|del\b.*\b{re.escape(name)}\b)")
        if any(rebind.match(x) for x in between) or any(f"{name}.resize_" in x or f"{name}.set_" in x for x in between):
            continue
        shared.add(name)
        hoist.setdefault(at[0], []).append(name)
    if not shared:
        return lines
    out: list[str] = []
    for i, line in enumerate(lines):
        for name in hoist.get(i, ()):
            out.append(f"    _p{name} = {name}.data_ptr()")
        out.append(_DATA_PTR.sub(lambda m: f"_p{m.group(1)}" if m.group(1) in shared else m.group(0), line))
    return out


def _top_level(line: str) -> bool:
    return line.startswith("    ") and not line.startswith("     ")


def wrapper_source(s: ScheduledProgram, kernels: CompiledKernels, arena: bool = False) -> str:
    first = WrapperWriter(s, kernels, arena)
    text = first.write()
    shared = frozenset(k for k, n in first.view_uses.items() if n > 1)
    return WrapperWriter(s, kernels, arena, shared).write() if shared else text
