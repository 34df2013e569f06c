"""The pipeline's Triton matmul template: ``epilogue(A @ B (+ bias))`` as one kernel.

One kernel per (problem, configuration): sizes, strides and block sizes are literals, so the launch
passes nothing but pointers -- except a symbolic row count M (a dynamic language model's tokens: its
LM head in default mode), which the kernel takes as the size arguments of ``MatmulSpec.m_expr``
(declared i64, unspecialised: one binary for every M) and the grid computes per call. Each program
computes a ``[BLOCK_M, BLOCK_N]`` tile of one batch's product in fp32 (``tl.dot`` of bf16/fp16/fp32
operands; fp32 follows torch's tf32 setting), with grouped ordering so GROUP_M row-blocks share B tiles
in L2, masks for sizes that are not multiples of the blocks, and then runs the fused epilogue: the
body of a scheduled pointwise ``Kernel`` (in the product's logical index variables ``x0..``),
written by the ordinary Triton ``KernelWriter`` in its 2-D tile mode, where reading the product at
the point being computed is the accumulator (rounded to the product's dtype first, as the unfused
kernel would read it from memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from ..codegen.triton.heuristics import DEFAULT_CONFIG
from ..codegen.triton.kernel import (
    INT32_LIMIT,
    KernelWriter,
    TritonKernel,
    jit_decorator,
    size_arg_type,
)
from ..codegen.triton.ops import convert, tl_dtype
from ..codegen.triton.printer import python_index
from ..ir import Kernel, KernelNode, Load, index_vars
from ..knobs import triton_interpret
from .config import Config


@dataclass(frozen=True, slots=True)
class Operand:
    """A strided view of a buffer, as (batch, row, column) element strides (batch 0 for 2-D)."""

    buffer: str
    offset: int
    strides: tuple[int, int, int]

    def index(self, b: str, r: str, c: str) -> str:
        terms = [str(self.offset)] if self.offset else []
        for var, st in zip((b, r, c), self.strides):
            if st and var:
                terms.append(var if st == 1 else f"{var} * {st}")
        return " + ".join(terms) or "0"

    def extent(self, sizes: tuple[int, int, int]) -> int:
        return self.offset + sum((n - 1) * abs(s) for n, s in zip(sizes, self.strides)) + 1


@dataclass(frozen=True, slots=True)
class MatmulSpec:
    """One mm/addmm/bmm site: ``out[b, m, n] = bias[b, m, n] + sum_k a[b, m, k] * b[b, k, n]``."""

    op: str  # "mm" | "addmm" | "bmm"
    batch: int
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    bias: Operand | None
    out: Operand  # where the product lives (its buffer is the extern's output)
    dtype: torch.dtype  # operands and product
    # a symbolic row count (mm/addmm only): M as an expression of size symbols, ``m`` its example value
    m_expr: sympy.Expr | None = None

    @property
    def size_args(self) -> tuple[str, ...]:
        """The size symbols the kernel takes (those of ``m_expr``), by name."""
        if self.m_expr is None:
            return ()
        return tuple(sorted(str(x) for x in self.m_expr.free_symbols))

    def rows_text(self) -> str:
        """M as Python/Triton source over the size arguments (a literal when static)."""
        return str(self.m) if self.m_expr is None else python_index(self.m_expr)

    @property
    def batched(self) -> bool:
        return self.op == "bmm"

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return (self.batch, self.m, self.n) if self.batched else (self.m, self.n)

    def logical_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars("x", len(self.logical_shape))

    def store_index(self) -> sympy.Expr:
        """The product's storage index at the logical point ``x0..`` (what the epilogue loads)."""
        xs = self.logical_vars()
        st = self.out.strides if self.batched else self.out.strides[1:]
        return sympy.expand(self.out.offset + sum(v * s for v, s in zip(xs, st)))

    def key(self) -> str:
        return repr((self.op, self.batch, self.m, self.n, self.k, self.a.offset, self.a.strides, self.b.offset,
                     self.b.strides, self.bias and (self.bias.offset, self.bias.strides), self.out.offset,
                     self.out.strides, str(self.dtype), str(self.m_expr)))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): configurations that do well on Hopper/Ampere
MM_CONFIGS = [
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4), (128, 128, 32, 4, 4), (64, 64, 32, 4, 5), (32, 64, 64, 4, 4), (16, 64, 128, 4, 3),
    (16, 128, 64, 4, 4), (32, 32, 128, 4, 3), (64, 256, 32, 8, 4), (128, 32, 32, 4, 4),
]


# shared memory a thread block may use (opt-in), by CUDA compute capability; unknown: Hopper's
_SMEM_BY_ARCH = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


def smem_limit(device: str, cross_target: str = "") -> int:
    """Bytes of shared memory one program may use on ``device`` (or the cross-compile target)."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        optin = getattr(props, "shared_memory_per_block_optin", 0)
        if optin:
            return int(optin)
        return _SMEM_BY_ARCH.get(props.major * 10 + props.minor, 101376)
    if cross_target.startswith("cuda:") and cross_target[5:].isdigit():
        return _SMEM_BY_ARCH.get(int(cross_target[5:]), 101376)
    return _SMEM_BY_ARCH[90]


def smem_bytes(cfg: Config, dtype: torch.dtype) -> int:
    """Shared memory of a configuration's software pipeline: ``stages`` A and B tiles in flight."""
    bm, bn, bk = cfg.get("BLOCK_M"), cfg.get("BLOCK_N"), cfg.get("BLOCK_K")
    return cfg.num_stages * (bm * bk + bk * bn) * dtype.itemsize


def _clipped(spec: MatmulSpec, bm: int, bn: int, bk: int, w: int, s: int) -> Config:
    """A configuration with its blocks clipped to the problem (tl.dot needs 16 or more per side)."""
    bm, bn, bk = min(bm, max(16, _p2(spec.m))), min(bn, max(16, _p2(spec.n))), min(bk, max(16, _p2(spec.k)))
    while w > 1 and bm * bn < 32 * w * 8:  # a tile too small for its warps: fewer warps, same tile
        w //= 2
    return Config.make(num_warps=w, num_stages=s, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)


def template_configs(spec: MatmulSpec, limit: int | None = None, smem: int | None = None) -> list[Config]:
    """Candidate configurations, pruned before anything is compiled: blocks clipped to the problem
    (configurations that clip to the same one are one candidate) and configurations whose pipeline
    does not fit ``smem`` bytes of shared memory dropped."""
    out: list[Config] = []
    for cfg in MM_CONFIGS:
        c = _clipped(spec, *cfg)
        if c in out or (smem is not None and smem_bytes(c, spec.dtype) > smem):
            continue
        out.append(c)
    return out[:limit] if limit else out


# The untuned configuration (default mode: nothing is timed), the first that fits shared memory. Half
# precision: (128, 256, 64) with 8 warps and 3 stages, the fastest tried on GPT-2's LM head, a
# misaligned bf16 4096 x 768 @ 768 x 50257 (benchmarks/RESULTS.md). fp32 tiles hold twice the bytes:
# BLOCK_K 32 keeps 3 stages at 96 KiB, within every architecture's shared memory (not timed).
_DEFAULT_CONFIGS = {
    2: ((128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (64, 64, 32, 4, 4)),
    4: ((128, 128, 32, 8, 3), (64, 64, 32, 4, 4)),
}


def default_config(spec: MatmulSpec, smem: int) -> Config:
    """The template's configuration where nothing is measured (misaligned matmuls in default mode)."""
    choices = [_clipped(spec, *c) for c in _DEFAULT_CONFIGS[spec.dtype.itemsize]]
    return next((c for c in choices if smem_bytes(c, spec.dtype) <= smem), choices[-1])


def _operands(dtype: torch.dtype) -> str:
    """tl.dot's operands. The Triton interpreter multiplies bf16/fp16 blocks as their raw bits: there
    (CPU tests only) they are widened first, which is exact (a product of two halves fits fp32)."""
    if dtype != torch.float32 and triton_interpret():
        return "a.to(tl.float32), b.to(tl.float32)"
    return "a, b"


class _EpilogueWriter(KernelWriter):
    """KernelWriter in 2-D tile mode over the template's ``[BLOCK_M, BLOCK_N]`` tile: the last logical
    variable walks columns (``xmask``), the others rows and batch (``ymask``)."""

    def __init__(self, k: Kernel, block_m: int, block_n: int) -> None:
        super().__init__(k, DEFAULT_CONFIG, split=len(k.outer) - 1)
        self.block_shape = f"[{block_m}, {block_n}]"

    def shape(self, ctx: str) -> str:
        return self.block_shape


@dataclass(frozen=True, slots=True)
class Epilogue:
    """What the template runs after the product: ``kernel``'s nodes (over the logical variables,
    loads of ``spec.out.buffer`` at ``spec.store_index()`` only), and whether the product itself is
    stored (it is read elsewhere or returned)."""

    kernel: Kernel | None
    store_product: bool


def render(name: str, spec: MatmulSpec, cfg: Config, epilogue: Epilogue) -> tuple[str, tuple[str, ...]]:
    """The kernel's source and its pointer arguments (buffer names, in order)."""
    bm, bn, bk, gm = (cfg.get(x) for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"))
    nodes = epilogue.kernel.nodes if epilogue.kernel is not None else ()
    k = Kernel(name, tuple(sympy.Integer(v) for v in spec.logical_shape), (), nodes, (), ())
    w = _EpilogueWriter(k, bm, bn)
    pa, pb = w.ptr(spec.a.buffer), w.ptr(spec.b.buffer)
    sizes = (spec.batch, spec.m, spec.k)
    big = spec.m_expr is not None or max(spec.a.extent(sizes), spec.b.extent((spec.batch, spec.k, spec.n)),
                                         spec.out.extent((spec.batch, spec.m, spec.n))) > INT32_LIMIT or w.int64
    i64 = ".to(tl.int64)" if big else ""
    np_ = _cdiv(spec.n, bn)
    # static: M's literal; symbolic: ``M`` computed from the size arguments (``rm % M`` never runs with
    # M = 0: the wrapper launches no program then)
    m_txt = str(spec.m) if spec.m_expr is None else "M"
    mp = str(_cdiv(spec.m, bm)) if spec.m_expr is None else f"((M + {bm - 1}) // {bm})"
    dot = ""
    if spec.dtype == torch.float32:
        dot = ', input_precision="tf32"' if torch.backends.cuda.matmul.allow_tf32 else ', input_precision="ieee"'
    bvar = "pid_b" if spec.batched else ""
    ep_text = ", ".join(n.buffer for n in nodes) or "none"
    head = [
        f"# {spec.op} [{spec.batch}x]{spec.rows_text()}x{spec.k} @ {spec.k}x{spec.n} {spec.dtype}, fp32 accumulation; "
        f"{cfg.label}; fused epilogue: {ep_text}",
        *([f"M = {spec.rows_text()}"] if spec.m_expr is not None else []),
        f"pid = tl.program_id(0){i64}",
        *([f"pid_b = tl.program_id(1){i64}"] if spec.batched else []),
        f"group_id = pid // {gm * np_}",  # grouped ordering: GROUP_M row-blocks share B tiles in L2
        f"first_pid_m = group_id * {gm}",
        f"group_size_m = tl.minimum({mp} - first_pid_m, {gm})",
        f"pid_m = first_pid_m + ((pid % {gm * np_}) % group_size_m)",
        f"pid_n = (pid % {gm * np_}) // group_size_m",
        f"rm = pid_m * {bm} + tl.arange(0, {bm})",
        f"rn = pid_n * {bn} + tl.arange(0, {bn})",
        f"rk = tl.arange(0, {bk})",
        # rows/columns past the edge wrap around (their results are masked at the end), so operand
        # loads need no row/column mask; the K tail is masked only when K is not a multiple of BLOCK_K
        f"ram = rm % {m_txt}",
        f"rbn = rn % {spec.n}",
        f"a_ptrs = {pa} + ({spec.a.index(bvar, 'ram[:, None]', 'rk[None, :]')})",
        f"b_ptrs = {pb} + ({spec.b.index(bvar, 'rk[:, None]', 'rbn[None, :]')})",
        f"acc = tl.zeros(({bm}, {bn}), dtype=tl.float32)",
        f"for kb in range(0, {_cdiv(spec.k, bk)}):",
        *(["    a = tl.load(a_ptrs)", "    b = tl.load(b_ptrs)"] if spec.k % bk == 0 else [
            f"    k_left = {spec.k} - kb * {bk}",
            "    a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)",
            "    b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)"]),
        f"    acc += tl.dot({_operands(spec.dtype)}{dot})",
        f"    a_ptrs += {bk * spec.a.strides[2]}",
        f"    b_ptrs += {bk * spec.b.strides[1]}",
        f"ymask = rm[:, None] < {m_txt}",
        f"xmask = rn[None, :] < {spec.n}",
    ]
    xs = [v.name for v in spec.logical_vars()]
    if spec.batched:
        head.append(f"{xs[0]} = pid_b + tl.zeros([{bm}, 1], tl.int32)")
    head += [f"{xs[-2]} = rm[:, None]", f"{xs[-1]} = rn[None, :]"]
    if spec.bias is not None:
        pbias = w.ptr(spec.bias.buffer)
        idx = spec.bias.index(bvar, "rm[:, None]", "rn[None, :]")
        head.append(f"acc += tl.load({pbias} + ({idx}) + tl.zeros([{bm}, {bn}], tl.int32), ymask & xmask, "
                    "other=0.0).to(tl.float32)")
    head.append(f"product = {convert('acc', torch.float32, spec.dtype)}")  # rounded as memory would hold it
    if epilogue.store_product:
        st = spec.out.strides if spec.batched else spec.out.strides[1:]
        idx = " + ".join([str(spec.out.offset)] * bool(spec.out.offset)
                         + [f"{x} * {s}" for x, s in zip(xs, st) if s]) or "0"
        val = "product" if spec.dtype == torch.float32 else f"product.to({tl_dtype(spec.dtype)})"
        head.append(f"tl.store({w.ptr(spec.out.buffer)} + ({idx}), {val}, ymask & xmask)")
    # the epilogue reads the product at the point computed: that is ``product``
    w.produced[spec.out.buffer] = KernelNode(spec.out.buffer, "outer", "pointwise", Load(spec.out.buffer, sympy.S.Zero,
                                             spec.dtype), spec.store_index(), spec.dtype, 0, False)
    w.locals[spec.out.buffer] = ("product", frozenset("xy"), 0)
    for n in nodes:
        w.emit_elementwise(n, "point")
    order = list(w.ptrs)
    params = [w.ptrs[b] for b in order] + [f'{x}: "{size_arg_type(x)}"' for x in spec.size_args]
    lines = [jit_decorator(spec.size_args), f"def {name}({', '.join(params)}):"]
    lines += ["    " + x for x in head] + w.lines
    return "\n".join(lines), tuple(order)


@dataclass(frozen=True, slots=True)
class MatmulTritonKernel(TritonKernel):
    """A template kernel as the wrapper sees it: pointers only, a literal grid, pipeline stages."""

    num_stages: int = 1
    grid_dims: tuple[int, int, int] = (1, 1, 1)

    @property
    def grid(self) -> str:
        # symbolic M: ``xnumel`` is M rounded up to whole row blocks times the column blocks' width,
        # so the parent's ceil(xnumel / xblock) is the program count (C++ launch sites use the same)
        return repr(self.grid_dims) if not self.size_args else TritonKernel.grid.fget(self)  # type: ignore[attr-defined]

    def launcher_definition(self, module: str, inputs: frozenset[str] | None = None) -> str:
        check = None if inputs is None else tuple(i for i, b in enumerate(self.pointer_args) if b in inputs)
        free = tuple(range(len(self.pointer_args), len(self.pointer_args) + len(self.size_args)))
        return (f"{self.launcher_var} = _KilnLaunch({module}.{self.function or self.name}, {{}}, {self.num_warps}, "
                f"{check!r}, "
                f"{self.num_stages}{f', free={free!r}' if free else ''}{', pdl=True' if self.pdl else ''})")


def template_kernel(name: str, spec: MatmulSpec, cfg: Config, epilogue: Epilogue) -> MatmulTritonKernel:
    source, ptrs = render(name, spec, cfg, epilogue)
    bm, bn = cfg.get("BLOCK_M"), cfg.get("BLOCK_N")
    grid = (_cdiv(spec.m, bm) * _cdiv(spec.n, bn), spec.batch, 1)
    if spec.m_expr is not None:  # mm/addmm (batch 1): programs = ceil(M / BLOCK_M) x column blocks
        xnumel = f"((({spec.rows_text()}) + {bm - 1}) // {bm}) * {bm * _cdiv(spec.n, bn)}"
        return MatmulTritonKernel(name=name, source=source, pointer_args=ptrs, size_args=spec.size_args,
                                  xnumel=xnumel, xblock=bm, rblock=0, num_warps=cfg.num_warps, kind="mm_template",
                                  num_stages=cfg.num_stages, grid_dims=grid)
    return MatmulTritonKernel(name=name, source=source, pointer_args=ptrs, size_args=(),
                              xnumel=str(spec.batch * spec.m * spec.n), xblock=cfg.get("BLOCK_N"), rblock=0,
                              num_warps=cfg.num_warps, kind="mm_template", num_stages=cfg.num_stages,
                              grid_dims=grid)


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateKernel(Kernel):
    """A scheduled kernel that is a matmul template: ``spec``'s product with the chosen ``config``,
    then ``nodes`` (the fused epilogue, over the product's logical variables). ``inputs``/``outputs``
    cover the operands too, so memory planning keeps them alive until it runs."""

    spec: MatmulSpec
    config: Config
    store_product: bool

    def triton_kernels(self) -> list[TritonKernel]:
        return [template_kernel(self.name, self.spec, self.config, Epilogue(self, self.store_product))]

    def as_text(self) -> str:
        s = self.spec
        shape = (s.rows_text(), s.n) if s.m_expr is not None else s.logical_shape
        head = (f"template {self.name}: {s.op} {s.out.buffer}[{', '.join(map(str, shape))}] = "
                f"{s.a.buffer} @ {s.b.buffer}" + (f" + {s.bias.buffer}" if s.bias else "")
                + f" ({self.config.label}) {'stored' if self.store_product else 'in registers'}"
                + f" reads ({', '.join(self.inputs)}) writes ({', '.join(self.outputs)})")
        return "\n".join([head, *(n.as_text() for n in self.nodes)])
