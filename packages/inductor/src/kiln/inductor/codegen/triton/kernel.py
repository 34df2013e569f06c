"""One scheduled ``Kernel`` -> one ``@triton.jit`` function's source and its launch description.

Layout of a generated kernel:

- pointwise: ``xindex`` is a 1-D block of flat outer positions; kernel variables ``x0..`` are
  ``xindex`` split by div/mod over the (coalesced) outer sizes.
- row kernel, persistent: a ``[XBLOCK, RBLOCK]`` tile holds whole rows; stages run one after another
  on registers, reductions give ``[XBLOCK, 1]`` values that later stages broadcast.
- row kernel, looped: each stage is an ``for roffset in range(0, rnumel, RBLOCK)`` loop accumulating
  elementwise into ``[XBLOCK, RBLOCK]`` accumulators, reduced across lanes after the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ...ir import Cast as CastExpr
from ...ir import (
    Constant,
    Expr,
    IndexExpr,
    IndexValue,
    Kernel,
    KernelNode,
    Load,
    Op,
    index_var,
    is_float_symbol,
    kernel_size_symbols,
    reads,
    substitute_hints,
    substitute_index,
    walk,
)
from ...ir.index import product, walks_rows
from .heuristics import (
    DEFAULT_CONFIG,
    BlockChoice,
    TritonConfig,
    next_pow2,
    pointwise_blocks,
    prev_pow2,
    row_blocks,
    static,
)
from .ops import compute_dtype, convert, emit_op, literal, operand_dtypes, tl_dtype
from .prefetch import Stream, find_streams
from .printer import IndexPrinter, python_index
from .reductions import ReductionEmitter
from .tiling import simplify_kernel

INT32_LIMIT = 2**31 - 1

# Note: size arguments. A kernel with symbolic sizes takes them as ints declared ``i64`` and listed in
# ``do_not_specialize``: triton's key for them is then the declared type alone -- not the value ("== 1",
# "multiple of 16") and not its range (i32 vs i64) -- so the one binary is valid for every size the
# graph's guards allow (0, 1, odd, above 2**31), and it can be compiled ahead, before any size is known
# (ahead.py), as static kernels are. Indexing in such kernels is 64-bit anyway (``needs_int64``: a
# symbolic bound is unbounded), so the declared type costs nothing; what is given up is triton's
# divisibility hint on sizes. Kernels without size arguments keep ``@triton.jit`` as it was.
SIZE_ARG_TYPE = "i64"
# A float argument that varies (a learning rate: ir/sizes.py's float symbols) is declared ``fp64``:
# triton never specialises a float, so one binary serves every value, and the kernel reads the double
# the program passed (``tl.full([], zf0, tl.float64)``: under the interpreter the argument stays a
# Python float, which ``tl.full`` makes a float64 scalar without a float32 rounding on the way).
FLOAT_ARG_TYPE = "fp64"


def size_arg_type(name: str) -> str:
    return FLOAT_ARG_TYPE if is_float_symbol(name) else SIZE_ARG_TYPE


def size_arg_value(name: str, value: Any) -> int | float:
    """A size argument's value as the kernel takes it (a Python int, or a float for a float argument)."""
    return float(value) if is_float_symbol(name) else int(value)


def jit_decorator(size_args: Sequence[str]) -> str:
    """The kernel's decorator: its size arguments (by name) are never specialised on (SIZE_ARG_TYPE)."""
    return f"@triton.jit(do_not_specialize={list(size_args)!r})" if size_args else "@triton.jit"


@dataclass(frozen=True, slots=True)
class TritonKernel:
    """A generated Triton kernel and how to launch it (the Python wrapper's view of it).

    ``pointer_args`` are buffer names passed as tensors in that order, then ``size_args``, the size
    symbols (``s0``...) passed as ints, declared ``i64`` and unspecialised (SIZE_ARG_TYPE: one binary
    serves every size); ``grid`` is a Python expression over those names.
    """

    name: str
    source: str
    pointer_args: tuple[str, ...]
    size_args: tuple[str, ...]
    xnumel: str  # Python expression over size_args
    xblock: int
    rblock: int  # 0 for pointwise kernels
    num_warps: int
    kind: str  # "pointwise" | "pointwise_2d" | "persistent_reduction" | "looped_reduction"
    ynumel: str = "1"  # 2-D tiled pointwise kernels: the outer tile dimension (grid axis 1)
    yblock: int = 0
    # the module function this kernel launches when another kernel's source is the same up to names
    # ("" = its own, ``name``): identical layers compile one Triton function (share_identical_kernels)
    function: str = ""
    # other functions ``source`` defines, which the kernel calls (a kernel group's parts: group.py)
    helpers: tuple[str, ...] = ()
    # launched with programmatic dependent launch (pdl.py: the source starts with its wait)
    pdl: bool = False
    # whole-row reads of graph inputs nothing writes (weights) its programs prefetch into L2 before that
    # wait (prefetch.py); the backend keeps only those
    streams: tuple[Stream, ...] = ()

    @property
    def grid(self) -> str:
        """The launch grid: a literal when the sizes are static, else an expression over size_args."""
        # ceil division inline: no call of triton.cdiv per launch
        y = f"-(-({self.ynumel}) // {self.yblock})" if self.yblock else "1"
        expr = f"(-(-({self.xnumel}) // {self.xblock}), {y}, 1)"
        if self.size_args:
            return expr
        cdiv = lambda a, b: -(-a // b)  # noqa: E731
        gx = cdiv(int(eval(self.xnumel, {}, {})), self.xblock)  # noqa: S307 - our own printed integer
        gy = cdiv(int(eval(self.ynumel, {}, {})), self.yblock) if self.yblock else 1  # noqa: S307
        return f"({gx}, {gy}, 1)"

    @property
    def launcher_var(self) -> str:
        return f"_launch_{self.name}"

    def launcher_definition(self, module: str, inputs: frozenset[str] | None = None) -> str:
        """Module-level wrapper code creating this kernel's ``_KilnLaunch`` (codegen/triton/launcher.py).
        ``inputs``: the graph's input buffers, the only pointers whose alignment can change between
        calls (None: check every argument on every launch). The size arguments are ``free``: declared
        unspecialised (SIZE_ARG_TYPE), so a new size never needs another binary."""
        consts = {"XBLOCK": self.xblock, **({"RBLOCK": self.rblock} if self.rblock else {}),
                  **({"YBLOCK": self.yblock} if self.yblock else {})}
        check = None if inputs is None else tuple(i for i, b in enumerate(self.pointer_args) if b in inputs)
        free = tuple(range(len(self.pointer_args), len(self.pointer_args) + len(self.size_args)))
        fn = self.function or self.name
        tail = (f", free={free!r}" if free else "") + (", pdl=True" if self.pdl else "")
        return f"{self.launcher_var} = _KilnLaunch({module}.{fn}, {consts!r}, {self.num_warps}, {check!r}{tail})"

    def launch_code(self, module: str = "", args: Sequence[str] | None = None,
                    ctx: str = "_kiln_launch_context()") -> str:
        """One Python statement launching this kernel through its launcher; ``args`` default to the
        buffer names; ``ctx`` is the (device, stream) expression (the wrapper reads it once per call)."""
        call_args = list(args) if args is not None else list(self.pointer_args)
        call_args += list(self.size_args)
        return f"{self.launcher_var}({self.grid}, {ctx}, {', '.join(call_args)})"


def _is_kernel_var(s: sympy.Symbol) -> bool:
    """Loop variables (x*, r*) and indirect-load values (d*): everything in an index but sizes."""
    return s.name[:1] in ("x", "r", "d") and s.name[1:].isdigit()


size_symbols = kernel_size_symbols  # the kernel's size parameters (ir/sizes.py)


def _bound(e: sympy.Expr, sizes: dict[sympy.Symbol, IndexExpr]) -> float:
    """An upper bound of |e| over the iteration space (inf when symbolic)."""
    if isinstance(e, sympy.Integer):
        return abs(int(e))
    if isinstance(e, sympy.Symbol):
        s = sizes.get(e)
        return float("inf") if s is None or not isinstance(s, sympy.Integer) else int(s) - 1
    if isinstance(e, sympy.Add):
        return sum(_bound(a, sizes) for a in e.args)
    if isinstance(e, sympy.Mul):
        out = 1.0
        for a in e.args:
            out *= _bound(a, sizes)
        return out
    if type(e).__name__ == "FloorDiv":
        return _bound(e.args[0], sizes)
    if type(e).__name__ == "ModIndex":
        return _bound(e.args[1], sizes)
    if isinstance(e, (sympy.Max, sympy.Min)):
        return max(_bound(a, sizes) for a in e.args)
    return float("inf")


def needs_int64(k: Kernel) -> bool:
    sizes: dict[sympy.Symbol, IndexExpr] = {}
    for i, s in enumerate(k.outer):
        sizes[sympy.Symbol(f"x{i}", integer=True, nonnegative=True)] = s
    for i, s in enumerate(k.inner):
        sizes[sympy.Symbol(f"r{i}", integer=True, nonnegative=True)] = s
    bound = _bound(product(k.outer), {}) + _bound(product(k.inner), {}) + 4096
    for n in k.nodes:
        values = [x.index for x in walk(n.body) if isinstance(x, Load) or (isinstance(x, IndexValue)
                                                                           and not x.dtype.is_floating_point)]
        for e in [n.store_index, *values]:
            bound = max(bound, _bound(sympy.expand(e), sizes))
    return bound > INT32_LIMIT


def _var_classes(e: IndexExpr, split: int | None = None) -> frozenset[str]:
    """Which tile axes an index walks: "x", "r", and "y" for the outer group of a 2-D tiled kernel."""
    out = set()
    for s in sympy.sympify(e).free_symbols:
        if _is_kernel_var(s) and s.name[0] != "d":
            out.add("y" if split is not None and s.name[0] == "x" and int(s.name[1:]) < split else s.name[0])
    return frozenset(out)


def ptr_name(buffer: str) -> str:
    """The kernel parameter holding ``buffer``'s pointer."""
    return "ptr_" + "".join(c if c.isalnum() or c == "_" else "_" for c in buffer)


def _paren(code: str) -> str:
    return code if code.isidentifier() or code.isdigit() else f"({code})"


class KernelWriter:
    """Writes one kernel function; values are named temporaries, common subexpressions shared."""

    def __init__(self, k: Kernel, cfg: TritonConfig, split: int | None = None, index32: bool = False,
                 part: bool = False) -> None:
        self.k = k
        self.part = part  # a part of a kernel group (group.py): its program index arrives as ``pid``
        self.split = split  # 2-D tiling: outer dims [0, split) on the y axis, the rest on x
        self.cfg = cfg
        self.row = k.is_row_kernel
        self.lines: list[str] = []
        self.depth = 1
        self.counter = 0
        self.scopes: list[dict[tuple, tuple[str, frozenset[str]]]] = [{}]
        # predicates of the enclosing ``where`` branches: loads under them are masked by them, since the IR
        # promises an untaken branch's load is never evaluated (cat/pad read out of range there)
        self.preds: tuple[tuple[str, frozenset[str]], ...] = ()
        self.locals: dict[str, tuple[str, frozenset[str], int]] = {}  # buffer -> (var, uses, scope level)
        self.produced = {n.buffer: n for n in k.nodes}
        self.ptrs: dict[str, str] = {}
        self.barrier_emitted_at: set[int] = set()
        self.idx = IndexPrinter()
        self.red = ReductionEmitter(self)
        # index32: the program's sizes are guarded into a 32-bit index range (index_width.py)
        self.index32 = index32 and bool(size_symbols(k))
        self.int64 = needs_int64(k) and not self.index32

    # -- plumbing -------------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def tmp(self, prefix: str = "tmp") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def assign(self, code: str, prefix: str = "tmp") -> str:
        name = self.tmp(prefix)
        self.line(f"{name} = {code}")
        return name

    def push_scope(self) -> None:
        self.scopes.append(dict(self.scopes[-1]))
        self.depth += 1

    def pop_scope(self) -> None:
        self.scopes.pop()
        self.depth -= 1
        for b, (_, _, level) in list(self.locals.items()):
            if level >= len(self.scopes):
                del self.locals[b]
        self.barrier_emitted_at = {d for d in self.barrier_emitted_at if d <= len(self.scopes)}

    def ptr(self, buffer: str) -> str:
        if buffer not in self.ptrs:
            self.ptrs[buffer] = ptr_name(buffer)
        return self.ptrs[buffer]

    def shape(self, ctx: str) -> str:
        if self.split is not None:
            return "[YBLOCK, XBLOCK]"
        return {"point": "[XBLOCK]", "full": "[XBLOCK, RBLOCK]", "outer": "[XBLOCK, 1]"}[ctx]

    def mask_for(self, uses: frozenset[str]) -> str | None:
        parts = [m for c, m in (("y", "ymask"), ("x", "xmask"), ("r", "rmask")) if c in uses]
        return " & ".join(parts) if parts else None

    def ctx_uses(self, ctx: str) -> frozenset[str]:
        if self.split is not None:
            return frozenset("xy")
        return frozenset("xr") if ctx == "full" else frozenset("x")

    def classes(self, e: IndexExpr) -> frozenset[str]:
        return _var_classes(e, self.split)

    def index_code(self, e: IndexExpr) -> str:
        return self.idx(sympy.expand(e))

    # -- expressions ----------------------------------------------------------------------------------
    def value(self, e: Expr, ctx: str) -> tuple[str, frozenset[str]]:
        key = (e, ctx, self.preds)
        hit = self.scopes[-1].get(key)
        if hit is None and self.preds:  # already computed unconditionally: reuse it under any predicate
            hit = self.scopes[-1].get((e, ctx, ()))
        if hit is not None:
            return hit
        out = self._value(e, ctx)
        self.scopes[-1][key] = out
        return out

    def _value(self, e: Expr, ctx: str) -> tuple[str, frozenset[str]]:
        if isinstance(e, Load):
            return self.load(e, ctx)
        if isinstance(e, Constant):
            return literal(e.value, e.dtype), frozenset()
        if isinstance(e, IndexValue):
            idx = sympy.expand(e.index)
            if idx.is_number:
                return literal(int(idx), e.dtype), frozenset()
            if isinstance(idx, sympy.Symbol) and is_float_symbol(idx.name):  # a float argument (fp64)
                return self.assign(convert(f"tl.full([], {idx.name}, tl.float64)", torch.float64, e.dtype)), frozenset()
            code = self.index_code(idx)
            return self.assign(convert(f"({code}).to(tl.int64)", torch.int64, e.dtype)), self.classes(idx)
        if isinstance(e, CastExpr):
            code, uses = self.value(e.x, ctx)
            if compute_dtype(e.x.dtype) == compute_dtype(e.dtype) and e.dtype == e.x.dtype:
                return code, uses
            return self.assign(convert(code, e.x.dtype, e.dtype)), uses
        assert isinstance(e, Op), e
        if _guards_loads(e):
            return self.predicated_where(e, ctx)
        vals = [self.value(a, ctx) for a in e.args]
        want = operand_dtypes(e.name, [a.dtype for a in e.args], e.dtype)
        codes = [convert(c, a.dtype, w) for (c, _), a, w in zip(vals, e.args, want)]
        uses = frozenset().union(*(u for _, u in vals))
        operand = want[1] if e.name == "where" else want[0]
        return self.assign(emit_op(e.name, codes, operand, e.dtype)), uses

    def predicated_where(self, e: Op, ctx: str) -> tuple[str, frozenset[str]]:
        cond, cu = self.value(e.args[0], ctx)
        c = self.assign(convert(cond, e.args[0].dtype, torch.bool))
        outer = self.preds
        self.preds = outer + ((c, cu),)
        a, au = self.value(e.args[1], ctx)
        self.preds = outer + ((f"(~{c})", cu),)  # not "== 0": a 0-d comparison breaks interpreter masks
        b, bu = self.value(e.args[2], ctx)
        self.preds = outer
        a = convert(a, e.args[1].dtype, e.dtype)
        b = convert(b, e.args[2].dtype, e.dtype)
        return self.assign(emit_op("where", [c, a, b], e.dtype, e.dtype)), cu | au | bu

    def load(self, e: Load, ctx: str) -> tuple[str, frozenset[str]]:
        node = self.produced.get(e.buffer)
        if node is not None:
            local = self.locals.get(e.buffer)
            if local is not None and sympy.expand(e.index - node.store_index) == 0:
                return local[0], local[1]
            if not node.store:
                raise NotImplementedError(
                    f"kernel {self.k.name}: {e.buffer} is read at {e.index} where it is not available in "
                    f"registers, and it is not stored to memory (scheduler contract)")
            if len(self.scopes) not in self.barrier_emitted_at:
                self.line("tl.debug_barrier()")  # a value this kernel stored is read back by other lanes
                self.barrier_emitted_at.add(len(self.scopes))
        uses = self.classes(e.index)
        index = sympy.expand(e.index)
        if e.indirect:  # gather: d<k> in the index are int64 values computed at this point
            index, u = self.bind_indirect(index, e.indirect, ctx)
            uses |= u
        mask = self.mask_for(uses)
        index_uses = uses
        for pred, pu in self.preds:
            mask = f"{mask} & {pred}" if mask else pred
            uses |= pu
        other = "0" if not e.dtype.is_floating_point else "0.0"
        idx = self.index_code(index)
        if uses != index_uses or not uses:
            # a predicate spans more axes than the index, or one element feeds the whole block: widen the
            # pointer to the block (0-d loads also trip the interpreter, whose scalar compares give int32)
            uses = self.ctx_uses(ctx)
            idx = f"({idx}) + tl.zeros({self.shape(ctx)}, tl.int32)"
        args = f"{self.ptr(e.buffer)} + ({idx})"
        if mask:
            args += f", {mask}, other={other}"
        code = f"tl.load({args})"
        if compute_dtype(e.dtype) != e.dtype:
            code += ".to(tl.float32)"
        elif e.dtype == torch.bool:
            code = f"({code} != 0)"  # bool memory may load as int8: make it int1 for masks and where
        return self.assign(code), uses

    def store(self, n: KernelNode, code: str, ctx: str) -> None:
        if not n.store:
            return
        uses = self.classes(n.store_index)
        idx = self.index_code(n.store_index)
        need = self.ctx_uses(ctx)
        if not need <= uses:
            idx = f"({idx}) + tl.zeros({self.shape(ctx)}, tl.int32)"
        value = code if compute_dtype(n.dtype) == n.dtype else f"{code}.to({tl_dtype(n.dtype)})"
        self.line(f"tl.store({self.ptr(n.buffer)} + ({idx}), {value}, {self.mask_for(need)})")

    def bind_indirect(self, index: IndexExpr, indirect: Sequence[Expr], ctx: str
                      ) -> tuple[IndexExpr, frozenset[str]]:
        """Replace ``d<k>`` in ``index`` by temporaries holding the int64 values of ``indirect``."""
        binds: dict[str, sympy.Symbol] = {}
        uses: frozenset[str] = frozenset()
        for k, ind in enumerate(indirect):
            code, u = self.value(ind, ctx)
            binds[f"d{k}"] = sympy.Symbol(self.assign(convert(code, ind.dtype, torch.int64)), integer=True)
            uses |= u
        return index.xreplace({s: binds[s.name] for s in index.free_symbols if s.name in binds}), uses

    # -- nodes -----------------------------------------------------------------------------------------
    def emit_scatter(self, n: KernelNode) -> None:
        """out[index] = value / += value at every point (a pointwise kernel over the source space)."""
        code, uses = self.value(n.body, "point")
        code = self.assign(convert(code, n.body.dtype, n.dtype))
        index, iu = self.bind_indirect(sympy.expand(n.store_index), n.store_indirect, "point")
        idx = self.index_code(index)
        if not (uses | iu | self.classes(index)):
            idx = f"({idx}) + tl.zeros([XBLOCK], tl.int32)"
        value = code if compute_dtype(n.dtype) == n.dtype else f"{code}.to({tl_dtype(n.dtype)})"
        fn = "tl.atomic_add" if n.reduction_type == "add" else "tl.store"
        # duplicates: adds accumulate atomically; plain stores race (any one wins, as in torch on CUDA)
        self.line(f"{fn}({self.ptr(n.buffer)} + ({idx}), {value}, xmask)")

    def emit_elementwise(self, n: KernelNode, ctx: str) -> None:
        code, uses = self.value(n.body, ctx)
        if n.body.dtype != n.dtype:
            code = self.assign(convert(code, n.body.dtype, n.dtype))
        self.locals[n.buffer] = (code, uses, len(self.scopes) - 1 if ctx == "full" else 0)
        self.store(n, code, ctx)

    def define_vars(self, prefix: str, sizes: Sequence[IndexExpr], flat: str, first: int = 0) -> None:
        n = len(sizes)
        for j in range(n):
            stride = product(list(sizes[j + 1:]))
            code = flat if stride == 1 else f"{flat} // {_paren(self.index_code(stride))}"
            if j > 0:
                code = f"{_paren(code)} % {_paren(self.index_code(sizes[j]))}"
            self.line(f"{prefix}{first + j} = {code}")

    def header(self, name: str) -> list[str]:
        consts = "XBLOCK: tl.constexpr" + (", RBLOCK: tl.constexpr" if self.row else "") + (
            ", YBLOCK: tl.constexpr" if self.split is not None else "")
        sizes = size_symbols(self.k)
        params = [self.ptrs[b] for b in self.ptr_order()] + [f'{s}: "{size_arg_type(s)}"' for s in sizes]
        params += ["pid", consts] if self.part else [consts]
        return [jit_decorator(sizes), f"def {name}({', '.join(params)}):"]

    def ptr_order(self) -> list[str]:
        order = list(dict.fromkeys([*self.k.inputs, *self.k.outputs]))
        order += [b for b in self.ptrs if b not in order]
        return [b for b in order if b in self.ptrs]

    def prologue_2d(self) -> None:
        k, split = self.k, self.split
        assert split is not None
        pid = ".to(tl.int64)" if self.int64 else ""
        self.line(f"ynumel = {self.index_code(product(list(k.outer[:split])))}")
        self.line(f"xnumel = {self.index_code(product(list(k.outer[split:])))}")
        self.line(f"yindex = tl.program_id(1){pid} * YBLOCK + tl.arange(0, YBLOCK)[:, None]")
        self.line(f"xindex = tl.program_id(0){pid} * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
        self.line("ymask = yindex < ynumel")
        self.line("xmask = xindex < xnumel")
        self.define_vars("x", k.outer[:split], "yindex")
        self.define_vars("x", k.outer[split:], "xindex", split)

    def prologue(self) -> None:
        k = self.k
        if self.split is not None:
            return self.prologue_2d()
        if self.index32:  # size arguments arrive as i64 (SIZE_ARG_TYPE): index arithmetic in i32 from here
            for name in size_symbols(k):
                if not is_float_symbol(name):
                    self.line(f"{name} = {name}.to(tl.int32)")
        self.line(f"xnumel = {self.index_code(product(list(k.outer)))}")
        first = "pid" if self.part else "tl.program_id(0)"
        pid = f"{first}.to(tl.int64)" if self.int64 else first
        self.line(f"xoffset = {pid} * XBLOCK")
        if self.row:
            self.line(f"rnumel = {self.index_code(product(list(k.inner)))}")
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
            self.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        else:
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        self.line("xmask = xindex < xnumel")
        self.define_vars("x", k.outer, "xindex")

    def r_setup(self, offset: str) -> None:
        self.line(f"rindex = {offset}rbase")
        self.line("rmask = rindex < rnumel")
        self.define_vars("r", self.k.inner, "rindex")

    def issue_row_loads(self) -> None:
        """Emit first the loads of whole rows (indexed by x and r) that no predicate guards, so their
        memory latency overlaps what the kernel computes before it uses them (a one-row matmul recomputing
        the RMSNorm statistic of its vector reduces that vector first)."""
        for n in self.k.nodes:
            for ld in _unguarded_loads(n.body):
                if ld.buffer not in self.produced and not ld.indirect and self.classes(ld.index) >= {"x", "r"}:
                    self.value(ld, "full")

    def write(self, blocks: BlockChoice, streaming: bool = False) -> str:
        """``streaming``: the row kernel stores per-row results only; a persistent one issues its row
        loads first."""
        self.prologue()
        if not self.row:
            for n in self.k.nodes:
                if n.kind == "scatter":
                    self.emit_scatter(n)
                    continue
                if n.kind != "pointwise":
                    raise NotImplementedError(f"kernel {self.k.name}: {n.kind} node {n.buffer} outside a row kernel")
                self.emit_elementwise(n, "point")
        elif blocks.persistent:
            self.r_setup("")
            if streaming:
                self.issue_row_loads()
            self.red.persistent_body(self.k.nodes)
        else:
            self.red.looped_body(self.k.nodes)
        body = self.lines
        return "\n".join(self.header(self.k.name) + body)


def split_scatter(k: Kernel) -> list[Kernel]:
    """A scatter kernel runs as two launches: the initial copy over the output, then the scatter as a
    pointwise kernel over the source space (its r* renamed to x*)."""
    init = [n for n in k.nodes if n.kind != "scatter"]
    scat = [n for n in k.nodes if n.kind == "scatter"]
    ren = {index_var("r", i): index_var("x", i) for i in range(len(k.inner))}
    moved = [dataclasses.replace(n, body=substitute_index(n.body, ren), store_index=n.store_index.xreplace(ren),
                                 store_indirect=tuple(substitute_index(e, ren) for e in n.store_indirect),
                                 stage=0) for n in scat]
    inputs = tuple(dict.fromkeys(ld.buffer for n in moved for e in (n.body, *n.store_indirect) for ld in reads(e)))
    scatter = Kernel(f"{k.name}_scatter", k.inner, (), tuple(moved), inputs, k.outputs)
    if not init:  # written in place over its base (scheduler/inplace.py: plan_inplace_scatters)
        return [scatter]
    return [dataclasses.replace(k, name=f"{k.name}_init", inner=(), nodes=tuple(init)), scatter]


def generate_kernels(k: Kernel, cfg: TritonConfig = DEFAULT_CONFIG,
                     hints: dict[str, int] | None = None, index32: bool = False) -> list[TritonKernel]:
    """The launches of one scheduled kernel (one, or two for scatter kernels); ``hints``: the example
    inputs' values of size symbols (block sizes only); ``index32``: the sizes are guarded into a 32-bit
    index range (LoopProgram.index_bits)."""
    if any(n.kind == "scatter" for n in k.nodes):
        return [generate_kernel(part, cfg, hints, index32) for part in split_scatter(k)]
    return [generate_kernel(k, cfg, hints, index32)]


def generate_kernel(k: Kernel, cfg: TritonConfig = DEFAULT_CONFIG,
                    hints: dict[str, int] | None = None, index32: bool = False, part: bool = False) -> TritonKernel:
    """Triton source and launch description for one scheduled kernel; ``part``: a 1-D pointwise kernel
    written as a function a kernel group calls with its program index (group.py)."""
    simple = simplify_kernel(k)
    xnumel = product(list(simple.outer))
    split = None if simple.is_row_kernel else tile_split(simple)
    if split is not None:
        assert not part, f"{k.name}: a 2-D tiled kernel is not a group part"
        return _generate_2d(simple, cfg, split)
    writer = KernelWriter(simple, cfg, index32=index32, part=part)
    streaming = False
    if simple.is_row_kernel:
        rnumel = product(list(simple.inner))
        rhint = static(substitute_hints(rnumel, hints)) if hints else None
        rows = _r_contiguous(simple)  # a column reduction keeps its own blocks and order
        streaming = rows and all(n.role != "full" for n in simple.nodes if n.store)
        blocks = row_blocks(xnumel, rnumel, rows, cfg, rhint, streaming)
        kind = "persistent_reduction" if blocks.persistent else "looped_reduction"
    else:
        blocks = pointwise_blocks(xnumel, cfg)
        kind = "pointwise"
    source = writer.write(blocks, streaming)
    return TritonKernel(name=k.name, source=source, pointer_args=tuple(writer.ptr_order()),
                        size_args=tuple(size_symbols(simple)), xnumel=python_index(xnumel),
                        xblock=blocks.xblock, rblock=blocks.rblock, num_warps=blocks.num_warps, kind=kind,
                        streams=() if part else find_streams(simple))


def _guards_loads(e: Op) -> bool:
    """A ``where`` whose branches load: each branch's loads run under its predicate."""
    return e.name == "where" and any(isinstance(n, Load) for a in e.args[1:] for n in walk(a))


def _unguarded_loads(e: Expr) -> list[Load]:
    """The loads of ``e`` outside the branches of a predicated ``where`` (not the loads of an index)."""
    out, stack = [], [e]
    while stack:
        n = stack.pop()
        if isinstance(n, Load):
            out.append(n)
        elif isinstance(n, Op):
            stack.extend(reversed(n.args[:1] if _guards_loads(n) else n.args))
        elif isinstance(n, CastExpr):
            stack.append(n.x)
    return out


def _r_contiguous(k: Kernel) -> bool:
    """Whether loads walk memory along the reduced dim (row reductions) rather than across rows."""
    if not k.inner:
        return True
    r_last = sympy.Symbol(f"r{len(k.inner) - 1}", integer=True, nonnegative=True)
    x_last = sympy.Symbol(f"x{len(k.outer) - 1}", integer=True, nonnegative=True) if k.outer else None
    return walks_rows((e.index for n in k.nodes for e in walk(n.body) if isinstance(e, Load)), x_last, r_last)


def _contiguous_var(e: IndexExpr, n_outer: int) -> int | None:
    ex = sympy.expand(e)
    for j in range(n_outer):
        v = sympy.Symbol(f"x{j}", integer=True, nonnegative=True)
        if v in ex.free_symbols and ex.coeff(v) == 1:
            return j
    return None


def tile_split(k: Kernel) -> int | None:
    """Where to split the outer dims for a 2-D tile, when stores and loads are contiguous along
    different dims (a transpose); None keeps the 1-D layout."""
    n = len(k.outer)
    if n < 2 or any(static(s) is None for s in k.outer):
        return None
    store_dims = {d for nd in k.nodes if nd.store if (d := _contiguous_var(nd.store_index, n)) is not None}
    load_dims = {d for nd in k.nodes for e in walk(nd.body) if isinstance(e, Load) and not e.indirect
                 if (d := _contiguous_var(e.index, n)) is not None}
    if len(store_dims) != 1 or not (load_dims - store_dims):
        return None
    s = next(iter(store_dims))
    other = max(load_dims - store_dims)
    split = max(s, other)
    y = int(product(list(k.outer[:split])))
    x = int(product(list(k.outer[split:])))
    if y < 16 or x < 16:
        return None  # a thin tile gains nothing
    return split


def _memory_accesses(k: Kernel, limit: int) -> int:
    """Loads + stores of ``k``, counted up to just past ``limit``."""
    n = sum(1 for nd in k.nodes if nd.store)
    for nd in k.nodes:
        for e in walk(nd.body):
            n += isinstance(e, Load)
            if n > limit:
                return n
    return n


def _generate_2d(k: Kernel, cfg: TritonConfig, split: int) -> TritonKernel:
    ynumel, xnumel = product(list(k.outer[:split])), product(list(k.outer[split:]))
    big = _memory_accesses(k, cfg.tile_big_accesses) > cfg.tile_big_accesses
    elems = cfg.tile_block_big if big else cfg.tile_block
    side = prev_pow2(int(elems ** 0.5))  # 64 (or 32 for a big kernel)
    xblock = min(side, next_pow2(int(xnumel)))
    yblock = min(side, next_pow2(int(ynumel)), max(1, elems // xblock))
    if (int(ynumel) + yblock - 1) // yblock > 65535:  # CUDA's grid limit on axis 1
        writer = KernelWriter(k, cfg)
        blocks = pointwise_blocks(product(list(k.outer)), cfg)
        return TritonKernel(name=k.name, source=writer.write(blocks), pointer_args=tuple(writer.ptr_order()),
                            size_args=(), xnumel=python_index(product(list(k.outer))), xblock=blocks.xblock,
                            rblock=0, num_warps=blocks.num_warps, kind="pointwise")
    writer = KernelWriter(k, cfg, split)
    source = writer.write(BlockChoice(xblock, 0, 4, False))
    return TritonKernel(name=k.name, source=source, pointer_args=tuple(writer.ptr_order()), size_args=(),
                        xnumel=python_index(xnumel), xblock=xblock, rblock=0,
                        num_warps=4 if xblock * yblock >= 1024 else 2, kind="pointwise_2d",
                        ynumel=python_index(ynumel), yblock=yblock)
