"""C++/OpenMP source for one Kernel: parallel outer loops, simd inner loops, staged row reductions."""

from __future__ import annotations

import functools

import sympy
import torch

from ...ir import (
    Cast,
    Kernel,
    KernelGroup,
    KernelNode,
    Layout,
    Load,
    Op,
    children,
    kernel_size_symbols,
    product,
    size_param_ctype,
    walk,
)
from ...options import InductorOptions
from .exprs import ExprEmitter, cast_call, cindex
from .types import ctype, highest, lowest

ROW_CACHE_MAX = 8192  # floats per row array (on each thread's stack)
_EXPENSIVE = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "erf", "erfc", "sigmoid", "pow",
              "sin", "cos", "tan", "atan", "sqrt", "rsqrt", "truediv", "reciprocal"}
# any/all and NaN flags accumulate in int with |/&: g++ vectorises those; bool ||/&& reductions it does
# not (a max reduction with a bool NaN flag ran 15x slower than with an int one).
_OMP_RED = {"sum": "+", "prod": "*", "any": "|", "all": "&", "max": "max", "min": "min"}


def _init(rtype: str, d: torch.dtype) -> str:
    return {"sum": "0", "prod": "1", "any": "0", "all": "1", "max": lowest(d), "min": highest(d),
            "argmax": lowest(d), "argmin": highest(d)}[rtype]


def _acc_type(rtype: str, d: torch.dtype) -> str:
    return "int" if rtype in ("any", "all") else ctype(d)


# a float32 sum over more values than this accumulates in double: each partial sum is a running sum over its
# share, whose rounding error grows with the count (16M values: 1.7e-6 of the sum, eager's cascade sum 2.5e-8;
# a column mean over 4k rows 2.7e-6 against 2.4e-7, past assert_close's float32 rtol). A row's values are
# shared among a vector's lanes (and threads); a tile's columns each sum their rows alone, so those go wide
# sooner. Shorter sums (a row of a norm, a softmax) stay float
WIDE_ROW_SUM = 16384
WIDE_COLUMN_SUM = 1024


def _wide_sum(k: Kernel, r: KernelNode, limit: int = WIDE_ROW_SUM) -> bool:
    """Whether ``r`` (a reduction of ``k``) is a float32 sum of more than ``limit`` values: accumulated in
    double."""
    if r.reduction_type != "sum" or r.body.dtype != torch.float32:
        return False
    n = product(list(k.inner))
    return not n.is_number or int(n) > limit


def _sum_read(acc: str, wide: bool) -> str:
    """The accumulator ``acc`` as a value of the body's dtype (a double one rounded once)."""
    return f"static_cast<float>({acc})" if wide else acc


class CppKernelWriter:
    def __init__(self, k: Kernel, layouts: dict[str, Layout], options: InductorOptions) -> None:
        self.k, self.layouts, self.options = k, layouts, options
        self.lines: list[str] = []
        self.counter = [0]
        self.locals: dict[str, tuple[str, sympy.Expr]] = {}  # buffer -> (C++ name, index it holds)
        self.by_name = {kn.buffer: kn for kn in k.nodes}
        self.row_cache: dict = {}  # Expr -> (stage computing it, C++ slot)
        self.stage_now: int | None = None
        # an input overwritten in place is read through its output's pointer (one restrict pointer per
        # memory); stores of such a pointwise kernel wait until every load of the loop point is done (a
        # row kernel's in-place output is computed by the only node reading its input: _row_kernel_site)
        self.over = {i: o for o, i in k.inplace}
        # a scatter written in place over its base (plan_inplace_scatters) reads nothing it writes
        self.scatter_only = len(k.nodes) == 1 and k.nodes[0].kind == "scatter"
        self.defers = bool(k.inplace) and not self.scatter_only and not k.inner
        self.deferred: list[str] | None = [] if self.defers else None

    def ptr(self, buffer: str) -> str:
        return f"p_{self.over.get(buffer, buffer)}"

    def params(self) -> list[str]:
        params = [f"const {ctype(self.layouts[b].dtype)}* __restrict__ {self.ptr(b)}"
                  for b in kernel_params(self.k)[0]]
        params += [f"{ctype(self.layouts[b].dtype)}* __restrict__ {self.ptr(b)}" for b in self.k.outputs]
        return params + [f"const {size_param_ctype(s)} {s}" for s in kernel_size_symbols(self.k)]  # sizes, floats

    def _inplace_ok(self) -> bool:
        k = self.k
        if not k.inner:
            return all(kn.kind == "pointwise" for kn in k.nodes)
        return all(self.by_name[o].kind == "pointwise" and self.by_name[o].role == "outer" for o, _ in k.inplace)

    def signature(self) -> str:
        return f'extern "C" void {self.k.name}({", ".join(self.params())})'

    def load_hook(self, ld: Load) -> str | None:
        hit = self.locals.get(ld.buffer)
        if hit is not None and sympy.expand(hit[1] - ld.index) == 0:
            return hit[0]
        return None

    def emitter(self, indent: str) -> ExprEmitter:
        em = ExprEmitter(self.lines, indent, self.load_hook, self.ptr, self.counter)
        if self.stage_now is not None:
            for e, (stage, slot) in self.row_cache.items():
                if stage == self.stage_now:
                    em.row_cache_write[e] = slot
                elif stage < self.stage_now:
                    em.row_cache_read[e] = slot
        return em

    def plan_row_cache(self, indent: str) -> None:
        """Expensive subtrees an inner loop computes that a later inner loop needs again are kept in a
        per-row array instead of being recomputed (softmax: exp(x - max) feeds the sum and the output)."""
        k = self.k
        if len(k.inner) != 1 or not isinstance(k.inner[0], sympy.Integer) or int(k.inner[0]) > ROW_CACHE_MAX:
            return
        bodies: dict[int, list] = {}
        for kn in k.nodes:
            if kn.role == "full" or kn.kind == "reduction":
                bodies.setdefault(kn.stage, []).append(kn.body)
        if any(isinstance(e, Op) and e.name == "where" for bs in bodies.values() for b in bs for e in walk(b)):
            return  # branches are evaluated lazily; a cached value might never be written
        first: dict = {}  # subtree -> the first stage computing it
        for stage in sorted(bodies):
            for b in bodies[stage]:
                for e in walk(b):
                    first.setdefault(e, stage)
        for stage in sorted(bodies):
            for b in bodies[stage]:
                for e in _reused_subtrees(b, stage, first):
                    if e not in self.row_cache:
                        slot = f"rc{len(self.row_cache)}"
                        self.lines.append(f"{indent}{ctype(e.dtype)} {slot}[{int(k.inner[0])}];")
                        self.row_cache[e] = (first[e], f"{slot}[r0]")

    def compute(self, kn: KernelNode, indent: str) -> None:
        em = self.emitter(indent)
        val = em.emit(kn.body)
        name = f"v_{kn.buffer}"
        self.lines.append(f"{indent}auto {name} = {cast_call(val, kn.body.dtype, kn.dtype)};")
        self.locals[kn.buffer] = (name, kn.store_index)
        if kn.store:
            store = f"{indent}{self.ptr(kn.buffer)}[{cindex(kn.store_index)}] = {name};"
            (self.lines if self.deferred is None else self.deferred).append(store)

    def flush_stores(self) -> None:
        if self.deferred:
            self.lines.extend(self.deferred)
            self.deferred.clear()

    def loops(self, ranges: tuple, prefix: str, indent: str, pragma: str | None,
              innermost: str | None = None, first: tuple[str, str] | None = None) -> str:
        """Nested loops over ``ranges``: ``pragma`` before the outermost, ``innermost`` before the last;
        ``first``: the outermost loop's (start, end) instead of (0, its range)."""
        for j, r in enumerate(ranges):
            if j == 0 and pragma:
                self.lines.append(f"{indent}{pragma}")
            if j == len(ranges) - 1 and innermost:
                self.lines.append(f"{indent}{innermost}")
            lo, hi = first if j == 0 and first is not None else ("0", cindex(r))
            self.lines.append(f"{indent}for (int64_t {prefix}{j} = {lo}; {prefix}{j} < {hi}; ++{prefix}{j}) {{")
            indent += "  "
        return indent

    def close(self, n: int, indent: str) -> str:
        for _ in range(n):
            indent = indent[:-2]
            self.lines.append(f"{indent}}}")
        return indent

    def write(self) -> str:
        k = self.k
        if k.inplace and not self.scatter_only and not self._inplace_ok():
            raise ValueError(f"{k.name}: in-place outputs are planned for pointwise kernels and per-point "
                             "values of row kernels only")
        self.lines.append(self.signature() + " {")
        total = product(list(k.outer) + list(k.inner))
        parallel = self.parallel_clause(total)
        if parallel is None:
            self._body(None)
        else:
            # one thread (OMP_NUM_THREADS=1, torch.set_num_threads(1) runs): the serial loop. Entering
            # even a one-thread parallel region cost ~0.4 ms per kernel inside a model step here (a
            # 131k-element BN+add+ReLU kernel: 0.48 ms with the region, 0.05 ms without)
            self.lines.append("  if (omp_get_max_threads() > 1) {")
            self._body(parallel)
            self.lines.append("  } else {")
            self._reset()
            self._body(None)
            self.lines.append("  }")
        self.lines.append("}")
        return "\n".join(self.lines)

    def write_range(self, fn: str) -> str:
        """A serial function running this pointwise kernel over the flat points [lo, hi) of its outer
        space (row-major): one part of a KernelGroup (codegen/cpp/group.py), called per block."""
        k = self.k
        if k.inner or any(kn.kind != "pointwise" for kn in k.nodes):
            raise ValueError(f"{k.name}: only pointwise kernels run over a flat range")
        self.lines.append(f"static __attribute__((noinline)) void {fn}("
                          f"{', '.join(['const int64_t lo', 'const int64_t hi', *self.params()])}) {{")
        n = len(k.outer)
        if n >= 2:
            self._row_walk(n)
            self.lines.append("}")
            return "\n".join(self.lines)
        indent = "  "
        if n == 0:
            self.lines.append("  if (lo >= hi) return;")
        else:
            self.lines += ["  #pragma omp simd", "  for (int64_t x0 = lo; x0 < hi; ++x0) {"]
            indent = "    "
        self._points(indent)
        if n:
            self.close(1, indent)
        self.lines.append("}")
        return "\n".join(self.lines)

    def _points(self, indent: str) -> None:
        """The kernel's nodes at one point, stores last where the kernel writes over an input."""
        for kn in self.k.nodes:
            self.compute(kn, indent)
        self.flush_stores()

    def _row_walk(self, n: int) -> None:
        """[lo, hi) of an n-d outer space as rows of its last dim. A piece of a row (the range starts or
        ends inside one) is a simd loop over its part, the earlier dims' variables decomposed from the
        flat index; whole rows run with the row's static extent (g++ unrolls a short one: a 3-channel
        NCHW -> NHWC copy took 3x its ungrouped kernel's time with per-row divisions and a variable trip
        count) and step the earlier dims' variables like an odometer."""
        k, last = self.k, n - 1
        width = cindex(k.outer[last])
        self.lines += ["  int64_t f = lo;", "  while (f < hi) {",
                       f"    const int64_t row = f / {width};",
                       f"    const int64_t j0 = f - row * {width};",
                       "    int64_t rest = row;"]
        for j in range(last - 1, 0, -1):
            self.lines.append(f"    int64_t x{j} = rest % {cindex(k.outer[j])}; rest /= {cindex(k.outer[j])};")
        self.lines += ["    int64_t x0 = rest;",
                       f"    if (j0 == 0 && hi - f >= {width}) {{",
                       f"      const int64_t rows = (hi - f) / {width};",
                       "      for (int64_t q = 0; q < rows; ++q) {",
                       "        #pragma omp simd",
                       f"        for (int64_t x{last} = 0; x{last} < {width}; ++x{last}) {{"]
        self._points("          ")
        self.lines.append("        }")
        step = "++x0;"
        for j in range(1, last):
            step = f"if (++x{j} == {cindex(k.outer[j])}) {{ x{j} = 0; {step} }}"
        self.lines += [f"        {step}", "      }", f"      f += rows * {width};", "    } else {",
                       f"      const int64_t j1 = std::min<int64_t>({width}, j0 + (hi - f));",
                       "      #pragma omp simd",
                       f"      for (int64_t x{last} = j0; x{last} < j1; ++x{last}) {{"]
        self._reset()
        self._points("        ")
        self.lines += ["      }", "      f += j1 - j0;", "    }", "  }"]

    def _body(self, parallel: str | None) -> None:
        k = self.k
        if any(kn.kind == "scatter" for kn in k.nodes):
            self._scatter(parallel)
        elif not k.inner:
            self._pointwise(parallel)
        elif wants_tiling(k):
            self._rows_tiled(parallel)
        else:
            self._rows(parallel)

    def _reset(self) -> None:
        """Forget what the first variant of the body computed (the second starts from scratch)."""
        self.locals, self.row_cache, self.stage_now = {}, {}, None
        self.deferred = [] if self.defers else None

    def parallel_clause(self, total: sympy.Expr) -> str | None:
        """None: run serially; else the clause after ``omp parallel for``. Not ``if(...)``: g++ runs an
        ``omp parallel for simd if(false)`` loop unvectorised (a small kernel ran 20x slower), so static
        sizes decide here and symbolic ones pick the thread count."""
        threshold = self.options.parallel_threshold
        if isinstance(total, (int, sympy.Integer)):
            return None if int(total) <= threshold else ""
        return f"num_threads(({cindex(total)} > {threshold}) ? omp_get_max_threads() : 1)"

    def _pointwise(self, parallel: str | None) -> None:
        k = self.k
        n = len(k.outer)
        if n == 0:
            for kn in k.nodes:
                self.compute(kn, "  ")
            self.flush_stores()
            return
        pragma: str | None
        if n == 1:
            pragma = "#pragma omp simd" if parallel is None else f"#pragma omp parallel for simd {parallel}"
            indent = self.loops(k.outer, "x", "  ", pragma)
        else:
            coll = f" collapse({n - 1})" if n > 2 else ""
            pragma = None if parallel is None else f"#pragma omp parallel for{coll} {parallel}"
            indent = self.loops(k.outer[:-1], "x", "  ", pragma)
            self.lines.append(f"{indent}#pragma omp simd")
            self.lines.append(f"{indent}for (int64_t x{n - 1} = 0; x{n - 1} < {cindex(k.outer[-1])}; ++x{n - 1}) {{")
            indent += "  "
        for kn in k.nodes:
            self.compute(kn, indent)
        self.flush_stores()
        self.close(n, indent)

    def _rows_tiled(self, parallel: str | None) -> None:
        _Tiled.rows(self, parallel)

    def _scatter(self, parallel: str | None) -> None:
        """Copy the base in parallel, then scatter sequentially (deterministic: last write wins). A scatter
        written in place over its base (scheduler/inplace.py: plan_inplace_scatters) has no copy."""
        k = self.k
        sc = k.nodes[-1]
        if len(k.nodes) == 2:
            outer_k = Kernel(k.name, k.outer, (), (k.nodes[0],), k.inputs, k.outputs)
            saved, self.k = self.k, outer_k
            self._pointwise(None if parallel is None else self.parallel_clause(product(list(k.outer))))
            self.k = saved
        self.locals = {}
        indent = self.loops(k.inner, "r", "  ", None)
        em = self.emitter(indent)
        val = em.emit(sc.body)
        index = sc.store_index
        from ...ir import index_var
        binds = {}
        for j, e in enumerate(sc.store_indirect):
            t = em.emit(e)
            binds[index_var("d", j)] = sympy.Symbol(t, integer=True)
        target = f"{self.ptr(sc.buffer)}[{cindex(index.xreplace(binds))}]"
        v = cast_call(val, sc.body.dtype, sc.dtype)
        if sc.reduction_type == "add":
            if sc.dtype == torch.bfloat16:
                v = f"kiln_f32_to_bf16(kiln_bf16_to_f32({target}) + {cast_call(val, sc.body.dtype, torch.float32)})"
                self.lines.append(f"{indent}{target} = {v};")
            else:
                self.lines.append(f"{indent}{target} += {v};")
        else:
            self.lines.append(f"{indent}{target} = {v};")
        self.close(len(k.inner), indent)

    def _rows(self, parallel: str | None) -> None:
        k = self.k
        n = len(k.outer)
        stages = max(kn.stage for kn in k.nodes)
        reducers = [kn for kn in k.nodes if kn.kind == "reduction"]
        whole = n == 0 and stages == 0 and all(r.reduction_type in _OMP_RED for r in reducers)
        indent = "  "
        if n:
            coll = f" collapse({n})" if n > 1 else ""
            pragma = None if parallel is None else f"#pragma omp parallel for{coll} {parallel}"
            indent = self.loops(k.outer, "x", indent, pragma)
        if stages > 0:
            self.plan_row_cache(indent)
        for s in range(stages + 1):
            for kn in k.nodes:  # outer values ready before this stage's loop
                if kn.role == "outer" and kn.kind != "reduction" and kn.stage == s:
                    self.compute(kn, indent)
            self.stage_now = s
            self._stage(s, indent, whole, parallel)
            self.stage_now = None
        for kn in k.nodes:
            if kn.role == "outer" and kn.kind != "reduction" and kn.stage == stages + 1:
                self.compute(kn, indent)
        self.close(n, indent)

    def _stage(self, s: int, indent: str, whole: bool, parallel: str | None) -> None:
        k = self.k
        full = [kn for kn in k.nodes if kn.stage == s and (kn.role == "full" or kn.kind == "reduction")]
        if not full:
            return
        if any(kn.kind == "scan" for kn in full):
            self._scan(full, indent)
            return
        reds = [kn for kn in full if kn.kind == "reduction"]
        clauses = []
        for r in reds:
            acc = f"acc_{r.buffer}"
            t = "double" if _wide_sum(k, r) else _acc_type(r.reduction_type, r.body.dtype)
            self.lines.append(f"{indent}{t} {acc} = {_init(r.reduction_type, r.body.dtype)};")
            if r.reduction_type.startswith("arg"):
                self.lines.append(f"{indent}int64_t idx_{r.buffer} = 0;")
            elif r.reduction_type in ("max", "min"):
                self.lines.append(f"{indent}int nan_{r.buffer} = 0;")
                clauses.append(f"reduction({_OMP_RED[r.reduction_type]}:{acc}) reduction(|:nan_{r.buffer})")
            else:
                clauses.append(f"reduction({_OMP_RED[r.reduction_type]}:{acc})")
        simd_ok = not any(r.reduction_type.startswith("arg") for r in reds)
        pragma = innermost = None
        red = " ".join(clauses)
        if simd_ok and len(k.inner) > 1:
            # simd on the innermost loop: g++ vectorising the outer one of [s0, 1024] unrolled the
            # inner loop whole (a symbolic ResNet-18 training graph's BatchNorm statistics: minutes
            # of g++ for one kernel file)
            pragma = f"#pragma omp parallel for {parallel} {red}" if whole and parallel is not None else None
            innermost = f"#pragma omp simd {red}"
        elif simd_ok:
            pragma = ("#pragma omp parallel for simd " + parallel + " " if whole and parallel is not None
                      else "#pragma omp simd ") + red
        saved = dict(self.locals)
        inner = self.loops(k.inner, "r", indent, pragma, innermost)
        for kn in full:
            if kn.kind == "pointwise":
                self.compute(kn, inner)
            else:
                self._accumulate(kn, inner)
        self.close(len(k.inner), inner)
        self.locals = saved
        for r in reds:
            acc = f"acc_{r.buffer}"
            if r.reduction_type.startswith("arg"):
                val = f"idx_{r.buffer}"
                src = torch.int64
            elif r.reduction_type in ("max", "min"):
                val = f"(nan_{r.buffer} ? std::numeric_limits<{ctype(r.body.dtype)}>::quiet_NaN() : {acc})" \
                    if r.body.dtype.is_floating_point else acc
                src = r.body.dtype
            elif r.reduction_type in ("any", "all"):
                val, src = f"({acc} != 0)", torch.bool
            else:
                val, src = _sum_read(acc, _wide_sum(k, r)), r.body.dtype
            name = f"v_{r.buffer}"
            self.lines.append(f"{indent}auto {name} = {cast_call(val, src, r.dtype)};")
            self.locals[r.buffer] = (name, r.store_index)
            if r.store:
                self.lines.append(f"{indent}{self.ptr(r.buffer)}[{cindex(r.store_index)}] = {name};")

    def _scan(self, nodes: list[KernelNode], indent: str) -> None:
        (kn,) = nodes
        acc = f"acc_{kn.buffer}"
        self.lines.append(f"{indent}{ctype(kn.body.dtype)} {acc} = {'0' if kn.reduction_type == 'sum' else '1'};")
        inner = self.loops(self.k.inner, "r", indent, None)
        v = self.emitter(inner).emit(kn.body)
        self.lines.append(f"{inner}{acc} {'+=' if kn.reduction_type == 'sum' else '*='} {v};")
        self.lines.append(f"{inner}{self.ptr(kn.buffer)}[{cindex(kn.store_index)}] = "
                          f"{cast_call(acc, kn.body.dtype, kn.dtype)};")
        self.close(len(self.k.inner), inner)

    def _accumulate(self, r: KernelNode, indent: str, suffix: str = "") -> None:
        v = self.emitter(indent).emit(r.body)
        acc, t = f"acc_{r.buffer}{suffix}", r.reduction_type
        if t == "sum":
            self.lines.append(f"{indent}{acc} += {v};")
        elif t == "prod":
            self.lines.append(f"{indent}{acc} *= {v};")
        elif t == "any":
            self.lines.append(f"{indent}{acc} |= (({v}) ? 1 : 0);")
        elif t == "all":
            self.lines.append(f"{indent}{acc} &= (({v}) ? 1 : 0);")
        elif t in ("max", "min"):
            cmp = ">" if t == "max" else "<"
            self.lines.append(f"{indent}{acc} = ({v} {cmp} {acc}) ? {v} : {acc};")
            if r.body.dtype.is_floating_point:
                nan = f"nan_{r.buffer}{suffix}"
                self.lines.append(f"{indent}{nan} |= ({v} != {v});")
        else:
            cmp = ">" if t == "argmax" else "<"
            flat = _flat_r(self.k.inner)
            if r.body.dtype.is_floating_point:
                cond = f"({v} {cmp} {acc} || ({v} != {v} && {acc} == {acc}))"
            else:
                cond = f"({v} {cmp} {acc})"
            self.lines.append(f"{indent}if ({cond}) {{ {acc} = {v}; idx_{r.buffer} = {flat}; }}")


TILE = 16


def wants_tiling(k: Kernel) -> bool:
    """Reductions over a strided dim whose outer neighbour is contiguous (sum over dim 0, channels of
    NCHW): vectorise across a tile of outer points instead of along the strided reduction."""
    if not k.outer or any(kn.kind == "scan" or kn.reduction_type.startswith("arg") for kn in k.nodes):
        return False
    from ...ir import index_var, index_vars
    xl, rl = index_var("x", len(k.outer) - 1), index_var("r", len(k.inner) - 1)
    rs = set(index_vars("r", len(k.inner)))
    unit_x = unit_r = 0
    for kn in k.nodes:
        for e in walk(kn.body):
            # loads that do not move with r (per-channel weights of a mean over H*W) are loop-invariant
            # in the row loop: they say nothing about which loop should be the contiguous one
            if isinstance(e, Load) and not e.indirect and rs & e.index.free_symbols:
                unit_x += _unit_stride(e.index, xl)
                unit_r += _unit_stride(e.index, rl)
    return unit_x > unit_r


@functools.lru_cache(maxsize=1 << 14)
def _unit_stride(index: sympy.Expr, v: sympy.Symbol) -> bool:
    return bool(index.coeff(v) == 1)


# Column reductions with few tiles of outer points (the BatchNorm statistics of a channels-last layer with
# <= 16 channels: one tile) would leave all but a few threads idle in the parallel loop over tiles: such
# kernels split their rows between the threads instead, each summing its share into a slot of a shared
# array (SPLIT_MAX_THREADS slots), combined in thread order after a barrier (deterministic per thread count)
SPLIT_MAX_TILES, SPLIT_MIN_ROWS, SPLIT_MAX_THREADS = 4, 64, 64


class _Tiled:
    """Row kernels tiled over the last outer loop: locals of outer values become TILE-wide arrays."""

    @staticmethod
    def rows(w: CppKernelWriter, parallel: str | None) -> None:
        k = w.k
        split = parallel is not None and _Tiled.splits_rows(k)
        n = len(k.outer)
        last = f"x{n - 1}"
        coll = f" collapse({n})" if n > 1 else ""
        indent = "  "
        if split:
            indent = _Tiled.open_split(w, indent)
        elif parallel is not None:
            w.lines.append(f"{indent}#pragma omp parallel for{coll} {parallel}")
        for j, r in enumerate(k.outer[:-1]):
            w.lines.append(f"{indent}for (int64_t x{j} = 0; x{j} < {cindex(r)}; ++x{j}) {{")
            indent += "  "
        size = cindex(k.outer[-1])
        w.lines.append(f"{indent}for (int64_t xt = 0; xt < {size}; xt += {TILE}) {{")
        indent += "  "
        w.lines.append(f"{indent}const int64_t xn = std::min<int64_t>({TILE}, {size} - xt);")
        stages = max(kn.stage for kn in k.nodes)
        guard = "if (kiln_tid == 0) " if split else ""
        over = {o for o, _ in k.inplace}
        for s in range(stages + 2):
            nodes = [kn for kn in k.nodes if kn.role == "outer" and kn.kind != "reduction" and kn.stage == s]
            _Tiled.outer_values(w, [kn for kn in nodes if kn.buffer not in over], indent, last, guard)
            mine = [kn for kn in nodes if kn.buffer in over]
            if mine and split:
                # an output written over its input (scheduler/inplace.py: _row_kernel_site) is computed
                # by one thread, so that no other loads the input after it was overwritten
                w.lines.append(f"{indent}if (kiln_tid == 0) {{")
                _Tiled.outer_values(w, mine, indent + "  ", last)
                w.lines.append(f"{indent}}}")
            else:
                _Tiled.outer_values(w, mine, indent, last, guard)
            if s <= stages:
                _Tiled.stage(w, s, indent, last, split)
        indent = w.close(n, indent)
        if split:
            w.close(2, indent)

    @staticmethod
    def splits_rows(k: Kernel) -> bool:
        """Whether this tiled kernel's rows are split between the threads (static sizes, sums only,
        few tiles, enough rows to share; the first reduction dim is the one divided)."""
        if not all(isinstance(x, sympy.Integer) for x in (*k.outer, *k.inner)):
            return False
        if any(kn.kind == "reduction" and kn.reduction_type != "sum" for kn in k.nodes):
            return False
        tiles = int(product(list(k.outer[:-1]))) * -(-int(k.outer[-1]) // TILE)
        return tiles <= SPLIT_MAX_TILES and int(k.inner[0]) >= 2 and int(product(list(k.inner))) >= SPLIT_MIN_ROWS

    @staticmethod
    def open_split(w: CppKernelWriter, indent: str) -> str:
        """The shared partial sums and the parallel region every thread runs the whole tile loop in."""
        w.lines.append(f"{indent}{{")
        for r in w.k.nodes:
            if r.kind == "reduction":
                t = "double" if _wide_sum(w.k, r, WIDE_COLUMN_SUM) else _acc_type(r.reduction_type, r.body.dtype)
                w.lines.append(f"{indent}  {t} part_{r.buffer}[{SPLIT_MAX_THREADS * TILE}];")
        rows = cindex(w.k.inner[0])
        w.lines += [f"{indent}  #pragma omp parallel num_threads(std::min<int>(omp_get_max_threads(), "
                    f"{SPLIT_MAX_THREADS}))",
                    f"{indent}  {{",
                    f"{indent}    const int64_t kiln_tid = omp_get_thread_num(), kiln_nth = omp_get_num_threads();",
                    f"{indent}    const int64_t kiln_r0_lo = {rows} * kiln_tid / kiln_nth;",
                    f"{indent}    const int64_t kiln_r0_hi = {rows} * (kiln_tid + 1) / kiln_nth;"]
        return indent + "    "

    @staticmethod
    def j_loop(w: CppKernelWriter, indent: str, last: str) -> str:
        w.lines.append(f"{indent}#pragma omp simd")
        w.lines.append(f"{indent}for (int64_t j = 0; j < xn; ++j) {{")
        w.lines.append(f"{indent}  const int64_t {last} = xt + j;")
        return indent + "  "

    @staticmethod
    def outer_values(w: CppKernelWriter, nodes: list[KernelNode], indent: str, last: str, guard: str = "") -> None:
        """Values per outer point (``guard``: the condition under which a thread stores them)."""
        if not nodes:
            return
        for kn in nodes:
            w.lines.append(f"{indent}{ctype(kn.dtype)} v_{kn.buffer}[{TILE}];")
        inner = _Tiled.j_loop(w, indent, last)
        for kn in nodes:
            val = w.emitter(inner).emit(kn.body)
            name = f"v_{kn.buffer}[j]"
            w.lines.append(f"{inner}{name} = {cast_call(val, kn.body.dtype, kn.dtype)};")
            w.locals[kn.buffer] = (name, kn.store_index)
            if kn.store:
                w.lines.append(f"{inner}{guard}{w.ptr(kn.buffer)}[{cindex(kn.store_index)}] = {name};")
        w.lines.append(f"{indent}}}")

    @staticmethod
    def stage(w: CppKernelWriter, s: int, indent: str, last: str, split: bool = False) -> None:
        """One stage's row loop; ``split``: over this thread's rows, the sums then combined across threads."""
        k = w.k
        full = [kn for kn in k.nodes if kn.stage == s and (kn.role == "full" or kn.kind == "reduction")]
        if not full:
            return
        reds = [kn for kn in full if kn.kind == "reduction"]
        for r in reds:
            t = "double" if _wide_sum(k, r, WIDE_COLUMN_SUM) else _acc_type(r.reduction_type, r.body.dtype)
            w.lines.append(f"{indent}{t} acc_{r.buffer}[{TILE}];")
            w.lines.append(f"{indent}int nan_{r.buffer}[{TILE}];")
            w.lines.append(f"{indent}for (int64_t j = 0; j < {TILE}; ++j) {{ acc_{r.buffer}[j] = "
                           f"{_init(r.reduction_type, r.body.dtype)}; nan_{r.buffer}[j] = 0; }}")
        saved = dict(w.locals)
        body_indent = w.loops(k.inner, "r", indent, None, first=("kiln_r0_lo", "kiln_r0_hi") if split else None)
        inner = _Tiled.j_loop(w, body_indent, last)
        for kn in full:
            if kn.kind == "pointwise":
                w.compute(kn, inner)
            else:
                w._accumulate(kn, inner, "[j]")
        w.lines.append(f"{body_indent}}}")
        w.close(len(k.inner), body_indent)
        w.locals = saved
        if not reds:
            return
        if split:
            # every thread's sums into its slot; after the barrier each thread adds the slots in thread
            # order (the same values everywhere); the second barrier keeps the slots until all have read
            for r in reds:
                w.lines.append(f"{indent}for (int64_t j = 0; j < {TILE}; ++j) "
                               f"part_{r.buffer}[kiln_tid * {TILE} + j] = acc_{r.buffer}[j];")
            w.lines.append(f"{indent}#pragma omp barrier")
            for r in reds:
                w.lines.append(f"{indent}for (int64_t j = 0; j < {TILE}; ++j) {{ acc_{r.buffer}[j] = "
                               f"{_init(r.reduction_type, r.body.dtype)}; for (int64_t t = 0; t < kiln_nth; ++t) "
                               f"acc_{r.buffer}[j] += part_{r.buffer}[t * {TILE} + j]; }}")
            w.lines.append(f"{indent}#pragma omp barrier")
        guard = "if (kiln_tid == 0) " if split else ""
        for r in reds:
            w.lines.append(f"{indent}{ctype(r.dtype)} v_{r.buffer}[{TILE}];")
        inner = _Tiled.j_loop(w, indent, last)
        for r in reds:
            acc = f"acc_{r.buffer}[j]"
            val, src = _sum_read(acc, _wide_sum(k, r, WIDE_COLUMN_SUM)), r.body.dtype
            if r.reduction_type in ("any", "all"):
                val, src = f"({acc} != 0)", torch.bool
            if r.reduction_type in ("max", "min") and r.body.dtype.is_floating_point:
                val = f"(nan_{r.buffer}[j] ? std::numeric_limits<{ctype(r.body.dtype)}>::quiet_NaN() : {acc})"
            name = f"v_{r.buffer}[j]"
            w.lines.append(f"{inner}{name} = {cast_call(val, src, r.dtype)};")
            w.locals[r.buffer] = (name, r.store_index)
            if r.store:
                w.lines.append(f"{inner}{guard}{w.ptr(r.buffer)}[{cindex(r.store_index)}] = {name};")
        w.lines.append(f"{indent}}}")



def _worth_caching(e: object) -> bool:
    """A per-row array store + load beats recomputing an expensive op or a chain of a few ops."""
    if not isinstance(e, (Op, Cast)) or not _varies(e):
        return False
    ops = [n for n in walk(e) if isinstance(n, (Op, Cast))]  # type: ignore[arg-type]
    return len(ops) >= 3 or any(isinstance(n, Op) and n.name in _EXPENSIVE for n in ops)


def _reused_subtrees(body: object, stage: int, first: dict) -> list:
    """The largest subtrees of ``body`` an earlier stage already computed (layer_norm -> gelu -> layer_norm:
    the whole first gelu output, not just its erf), top-down so nested ones are not cached twice."""
    out, stack = [], [body]
    while stack:
        e = stack.pop()
        if first.get(e, stage) < stage and _worth_caching(e):
            out.append(e)
            continue
        stack.extend(children(e))  # type: ignore[arg-type]
    return out


def _varies(e: object) -> bool:
    """Whether a body depends on the inner loop variable (loop-invariant values are not row-cached)."""
    from ...ir import IndexValue, index_var
    r0 = index_var("r", 0)
    return any(isinstance(n, (Load, IndexValue)) and r0 in n.index.free_symbols for n in walk(e))  # type: ignore[arg-type]


def _flat_r(inner: tuple) -> str:
    from ...ir import contiguous_strides, index_vars
    return cindex(sympy.expand(sum((v * s for v, s in zip(index_vars("r", len(inner)),
                                                            contiguous_strides(inner))), sympy.Integer(0))))


def kernel_params(k: Kernel | KernelGroup) -> tuple[list[str], list[str]]:
    """(input, output) buffers passed to the C++ function, in order; an input written over in place
    is passed once, as its output. A group's are its parts' (each once)."""
    over = {i for _, i in k.inplace}
    return [b for b in k.inputs if b not in over], list(k.outputs)


def kernel_source(k: Kernel, layouts: dict[str, Layout], options: InductorOptions) -> str:
    return CppKernelWriter(k, layouts, options).write()
