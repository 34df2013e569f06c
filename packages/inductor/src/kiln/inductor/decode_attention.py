"""Decode attention: scaled dot-product attention of one query row per head as a Triton kernel.

A decode step attends one new query per head over the whole KV cache. The library kernels are built for
many query rows: on an H200 cuDNN's took ~7.7 us per layer for 16 heads over 512 cached positions (2 MB
of keys and values, under a microsecond of memory traffic), efficient attention 27 us, flash 15
(2026-12-02 profile). Here each program takes one (batch, head): it holds the query in registers and
streams the keys and values in blocks of positions with an online softmax (running max,
sum and weighted values in float32), and a block whose mask is -inf everywhere (the cache positions
not written yet) is skipped without reading its keys or values.

Which calls (``decode_spec``): a forward SDPA extern (cuDNN, efficient, flash or the CPU flash op) of a
static query length 1, no dropout, not causal, static heads and head dim <= 256, at most
``MAX_POSITIONS`` keys (the example's, when the key count is symbolic: a growing cache), whose other
results (log-sum-exp, seeds) nothing reads -- inference. The mask may be additive (float) or boolean,
broadcast by strides. Symbolic sizes (batch, keys, strides) are the kernel's size arguments. Where a
query row's keys are all masked the result is 0 (torch's math path since 2.5; the fused kernels differ
among themselves there).

A single program per (batch, head) is slow for few heads: 16 programs on 16 of the GPU's 132 SMs, each
walking its cache in dependent rounds to memory (H100, 2026-12-05: 0.542 against cuDNN's 0.537 ms/token).
So the cache is split over programs as well (split-KV, "flash decoding"): ``splits`` programs per (batch,
head) each take one stretch of positions and write their running max, sum and weighted values to a
float32 workspace, and a second kernel (one program per (batch, head)) rescales and adds the stretches.
The split count (``_splits``) aims at about ``TARGET_PROGRAMS`` programs with stretches of at least
``MIN_SPLIT`` positions; a symbolic key count is split as for ``MAX_POSITIONS`` and divided among the splits
at run time (those past the last position exit at once). H100, 2026-12-05: 0.497 against cuDNN's 0.518
ms/token, so ``InductorOptions.decode_attention`` is on by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import sympy
import torch

from kiln.graph import log

from .codegen.triton.kernel import TritonKernel, jit_decorator, ptr_name, size_arg_type
from .codegen.triton.ops import tl_dtype
from .codegen.triton.printer import IndexPrinter, python_index
from .ir import (
    ConstArg,
    ExternKernel,
    ExternOutput,
    Kernel,
    Layout,
    LoopProgram,
    ScheduledProgram,
    TensorRef,
    size_symbols_of,
    substitute_hints,
    work_buffers,
)
from .scheduler.memory import plan_memory

# keys per (batch, head): its programs stream them all (a longer cache keeps the library kernel)
MAX_POSITIONS = 8192
# programs the split aims at (two per SM of an H100/H200), and the fewest positions one split takes
TARGET_PROGRAMS = 256
MIN_SPLIT = 64
# positions per block: a (BLOCK_N, head dim) tile of keys and one of values in registers, 8192 elements
# each (64 float32 per thread at 4 warps); fewer, larger blocks mean fewer dependent rounds to memory
TILE_ELEMENTS = 8192

# target -> where each argument is: (position or None, keyword). ATen's CUDA attention ops take ``scale``
# by keyword only; dropout and is_causal come either way (reading a position only missed a keyword's value)
_FORWARD: dict[str, dict[str, tuple[int | None, str]]] = {
    "aten._scaled_dot_product_cudnn_attention.default": {
        "mask": (3, "attn_bias"), "dropout": (5, "dropout_p"), "causal": (6, "is_causal"), "scale": (None, "scale")},
    "aten._scaled_dot_product_efficient_attention.default": {
        "mask": (3, "attn_bias"), "dropout": (5, "dropout_p"), "causal": (6, "is_causal"), "scale": (None, "scale")},
    "aten._scaled_dot_product_flash_attention.default": {
        "mask": (None, ""), "dropout": (3, "dropout_p"), "causal": (4, "is_causal"), "scale": (None, "scale")},
    "aten._scaled_dot_product_flash_attention_for_cpu.default": {
        "mask": (None, "attn_mask"), "dropout": (3, "dropout_p"), "causal": (4, "is_causal"), "scale": (None, "scale")},
}


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    q: TensorRef
    k: TensorRef
    v: TensorRef
    mask: TensorRef | None
    out: ExternOutput
    scale: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeAttentionKernel(Kernel):
    """A scheduled kernel that is the decode attention template over ``spec``."""

    spec: DecodeSpec
    splits: int = 1  # programs per (batch, head); above 1 they write ``workspace`` and a second kernel adds
    workspace: str | None = None

    def triton_kernels(self) -> list[TritonKernel]:
        if self.workspace is None:
            return [decode_kernel(self.name, self.spec)]
        return [decode_kernel(f"{self.name}_split", self.spec, self.splits, self.workspace),
                combine_kernel(self.name, self.spec, self.splits, self.workspace)]

    def as_text(self) -> str:
        s = self.spec
        mask = f" mask {s.mask.as_text()}" if s.mask is not None else ""
        split = f" in {self.splits} splits over {self.workspace}" if self.workspace else ""
        return (f"template {self.name}: decode attention {s.out.buffer} = softmax({s.q.as_text()} . "
                f"{s.k.as_text()} * {s.scale:g}{mask}) @ {s.v.as_text()}{split}")


def _arg(e: ExternKernel, where: tuple[int | None, str]) -> Any:
    """The call's argument at position ``where[0]`` or by keyword ``where[1]`` (None when absent)."""
    position, keyword = where
    if position is not None and position < len(e.args):
        return e.args[position]
    return dict(e.kwargs).get(keyword) if keyword else None


def _value(a: Any, default: Any) -> Any:
    return default if a is None else (a.value if isinstance(a, ConstArg) else a)


def _static(xs: tuple[Any, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in xs)
    except TypeError:
        return None


def _refs(spec: DecodeSpec) -> list[TensorRef]:
    return [t for t in (spec.q, spec.k, spec.v, spec.mask) if t is not None]


def decode_spec(e: ExternKernel, hints: dict[str, int] | None = None) -> DecodeSpec | str | None:
    """The call's spec; why the template does not take a one-query call; None for other calls. The batch
    and the key count may be symbolic (a growing cache), the heads and head dims are static; ``hints``
    (the example inputs' sizes) bound a symbolic key count."""
    how = _FORWARD.get(e.target)
    if how is None:
        return None
    q, k, v = e.args[:3]
    mask = _arg(e, how["mask"])
    mask = mask if isinstance(mask, TensorRef) else None
    if not (isinstance(q, TensorRef) and isinstance(k, TensorRef) and isinstance(v, TensorRef)):
        return "operands are not tensors"
    if len(q.shape) != 4 or _static(q.shape[2:3]) != (1,):
        return None  # not a decode step
    if len(k.shape) != 4 or len(v.shape) != 4 or tuple(k.shape[:2]) != tuple(q.shape[:2]) \
            or tuple(v.shape[:3]) != tuple(k.shape[:3]) or k.shape[3] != q.shape[3]:
        return f"keys and values do not match the query's heads (q {q.shape}, k {k.shape}, v {v.shape})"
    dims = _static((q.shape[1], q.shape[3], v.shape[3]))
    if dims is None:
        return "symbolic heads or head dim"
    n_keys = sympy.sympify(k.shape[2])
    n_hint = int(substitute_hints(n_keys, hints or {})) if (n_keys.is_number or hints) else None
    if max(dims[1:]) > 256 or n_hint is None or n_hint > MAX_POSITIONS or n_keys == 0:
        return "head dim above 256 or key count out of range"
    if _value(_arg(e, how["dropout"]), 0.0) != 0.0 or _value(_arg(e, how["causal"]), False):
        return "dropout or causal"
    if mask is not None and (len(mask.shape) != 4 or mask.dtype not in (torch.bool, torch.float16, torch.bfloat16,
                                                                         torch.float32)):
        return "mask layout"
    scale = _value(_arg(e, how["scale"]), None)
    return DecodeSpec(q, k, v, mask, e.outputs[0], float(scale) if scale is not None else 1.0 / math.sqrt(dims[1]))


def _read(s: ScheduledProgram, buffer: str) -> bool:
    """Whether any step or the program's outputs read ``buffer`` (an extern's result)."""
    return any(buffer in work_buffers(st.work) for st in s.steps) or \
        any(isinstance(o, TensorRef) and o.buffer == buffer for o in s.program.outputs)


def _splits(spec: DecodeSpec, hints: dict[str, int]) -> int:
    """Programs per (batch, head): about ``TARGET_PROGRAMS`` in all (at the example's batch), each over
    ``MIN_SPLIT`` positions or more -- of the example's key count when it is static; a symbolic one (a growing
    cache, first compiled at a short prompt) may reach ``MAX_POSITIONS``, and splits left without positions
    exit at once."""
    heads = int(substitute_hints(sympy.sympify(spec.q.shape[0] * spec.q.shape[1]), hints))
    n_keys = sympy.sympify(spec.k.shape[2])
    most = int(n_keys) if n_keys.is_number else MAX_POSITIONS
    return max(1, min(-(-TARGET_PROGRAMS // max(heads, 1)), most // MIN_SPLIT))


def template_decode_attention(s: ScheduledProgram) -> tuple[ScheduledProgram, int]:
    """``s`` with every attention call ``decode_spec`` takes run as the decode template; how many."""
    works: list[Any] = []
    workspaces: dict[str, ExternOutput] = {}  # extern call -> its template's workspace (a new buffer)
    hints = getattr(s.program, "hints", None) or {}
    for st in s.steps:
        w = st.work
        if not isinstance(w, ExternKernel):
            works.append(w)
            continue
        spec = decode_spec(w, hints)
        if isinstance(spec, DecodeSpec) and any(_read(s, o.buffer) for o in w.outputs[1:]):
            spec = "its log-sum-exp is read (training)"
        if isinstance(spec, str):
            log("perf_hints").info("attention %s keeps %s: %s", w.name, w.target, spec)
        if not isinstance(spec, DecodeSpec):
            works.append(w)
            continue
        ins = tuple(dict.fromkeys(t.buffer for t in (spec.q, spec.k, spec.v, spec.mask) if t is not None))
        heads = sympy.sympify(spec.q.shape[0] * spec.q.shape[1])
        splits = _splits(spec, hints)
        ws = None
        if splits > 1:  # per split program: running max, sum, then the weighted values
            ws = ExternOutput(f"ws_{w.name}", Layout.contiguous((heads * splits * (int(spec.v.shape[3]) + 2),),
                                                               torch.float32), (-1,))
            workspaces[w.name] = ws
        outs = ((ws.buffer,) if ws else ()) + (spec.out.buffer,)
        works.append(DecodeAttentionKernel(f"attn_{w.name}", (heads,), (), (), ins, outs, spec=spec, splits=splits,
                                           workspace=ws.buffer if ws else None))
    n = sum(isinstance(x, DecodeAttentionKernel) for x in works)
    if not n:
        return s, 0
    p = s.program
    assert isinstance(p, LoopProgram)
    # the workspace is an extra result of the call it replaces (the call itself never runs): that is how
    # the program's layouts, and so memory planning and the wrappers, know the buffer
    nodes = tuple(replace(node, outputs=(*node.outputs, workspaces[node.name])) if isinstance(node, ExternKernel)
                  and node.name in workspaces else node for node in p.nodes)
    p = replace(p, nodes=nodes)
    return ScheduledProgram(p, tuple(plan_memory(p, works))), n


# the program's own indices, one value each; the others (positions, head dims) are blocks
_SCALAR_INDICES = ("0", "b", "h")


def _offset(t: TensorRef | ExternOutput, index: list[str]) -> str:
    """The element offset of ``t[index]`` (a size-1 dim broadcasts: its index is 0 whatever its stride). A
    block index under such a dim stays as ``0 * index``: the offset keeps the block's shape, as the load's
    or store's mask has it (a mask of one value per batch row, one cached key, a head dim of 1)."""
    shape, stride, base = (t.layout.shape, t.layout.stride, t.layout.offset) if isinstance(t, ExternOutput) \
        else (t.shape, t.stride, t.offset)
    terms = [_code(base)]
    for n, s, i in zip(shape, stride, index):
        if n != 1 and s != 0 and i != "0":
            terms.append(f"({_code(s)}) * {i}")
        elif i not in _SCALAR_INDICES:
            terms.append(f"0 * {i}")
    return " + ".join(terms)


def _code(e: Any) -> str:
    return IndexPrinter()(sympy.expand(sympy.sympify(e)))


def _sizes(spec: DecodeSpec) -> list[str]:
    exprs = [e for t in _refs(spec) for e in (*t.shape, *t.stride, t.offset)]
    exprs += [*spec.out.layout.shape, *spec.out.layout.stride, spec.out.layout.offset]
    return sorted({sym.name for e in exprs for sym in size_symbols_of(sympy.sympify(e))})


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def decode_kernel(name: str, spec: DecodeSpec, splits: int = 1, workspace: str | None = None) -> TritonKernel:
    """One program per (batch, head) -- or per (batch, head, split) writing ``workspace`` -- streaming its
    positions with an online softmax."""
    b, h, d, dv = spec.q.shape[0], int(spec.q.shape[1]), int(spec.q.shape[3]), int(spec.v.shape[3])
    n_keys = _code(spec.k.shape[2])
    bd, bdv = _pow2(d), _pow2(dv)
    block_n = max(16, min(128, TILE_ELEMENTS // max(bd, bdv)))
    if splits > 1:  # one block per split at the example's sizes where it fits
        n_static = spec.k.shape[2]
        per_split = -(-int(n_static) // splits) if sympy.sympify(n_static).is_number else MIN_SPLIT
        block_n = max(16, min(block_n, _pow2(per_split)))
    ptrs = [spec.q.buffer, spec.k.buffer, spec.v.buffer] + ([spec.mask.buffer] if spec.mask is not None else [])
    ptrs = list(dict.fromkeys(ptrs)) + [workspace if workspace else spec.out.buffer]
    p = {x: ptr_name(x) for x in ptrs}
    sizes = _sizes(spec)
    params = [p[x] for x in ptrs] + [f'{z}: "{size_arg_type(z)}"' for z in sizes] + ["XBLOCK: tl.constexpr"]
    lines = [jit_decorator(sizes), f"def {name}({', '.join(params)}):", "    pid = tl.program_id(0).to(tl.int64)"]
    if workspace is None:
        lines += ["    bh = pid", "    lo = 0", f"    hi = {n_keys}"]
    else:  # this split's stretch of positions: a whole number of blocks
        lines += [f"    bh = pid // {splits}",
                  f"    chunk = ((({n_keys}) + {splits - 1}) // {splits} + {block_n - 1}) // {block_n} * {block_n}",
                  f"    lo = (pid % {splits}) * chunk",
                  f"    hi = tl.minimum(lo + chunk, {n_keys})"]
    lines += [
        f"    b = bh // {h}",
        f"    h = bh % {h}",
        f"    d = tl.arange(0, {bd})",
        f"    dv = tl.arange(0, {bdv})",
        f"    q = tl.load({p[spec.q.buffer]} + ({_offset(spec.q, ['b', 'h', '0', 'd'])}), d < {d}, other=0.0)",
        f"    q = q.to(tl.float32) * {spec.scale!r}",
        "    m_i = tl.full([], float('-inf'), tl.float32)",
        "    l_i = tl.zeros([], tl.float32)",
        f"    acc = tl.zeros([{bdv}], tl.float32)",
        f"    for start in range(lo, hi, {block_n}):",
        f"        n = start + tl.arange(0, {block_n})",
        "        nmask = n < hi",
    ]
    if spec.mask is None:
        lines.append("        bias = tl.where(nmask, 0.0, float('-inf'))")
    else:
        m = spec.mask
        load = f"tl.load({p[m.buffer]} + ({_offset(m, ['b', 'h', '0', 'n'])}), nmask, other=0)"
        if m.dtype == torch.bool:
            lines.append(f"        bias = tl.where(({load}) != 0, 0.0, float('-inf'))")
        else:
            lines.append(f"        bias = tl.where(nmask, ({load}).to(tl.float32), float('-inf'))")
    lines += [
        "        if tl.max(bias, 0) > float('-inf'):  # a block of positions all masked out is not read",
        f"            kk = tl.load({p[spec.k.buffer]} + ({_offset(spec.k, ['b', 'h', 'n[:, None]', 'd[None, :]'])}),"
        f" nmask[:, None] & (d[None, :] < {d}), other=0.0).to(tl.float32)",
        f"            vv = tl.load({p[spec.v.buffer]} + ({_offset(spec.v, ['b', 'h', 'n[:, None]', 'dv[None, :]'])}),"
        f" nmask[:, None] & (dv[None, :] < {dv}), other=0.0).to(tl.float32)",
        "            s = tl.sum(kk * q[None, :], 1) + bias",
        "            m_new = tl.maximum(m_i, tl.max(s, 0))",
        "            alpha = tl.exp(m_i - m_new)",
        "            pr = tl.exp(s - m_new)",
        "            l_i = l_i * alpha + tl.sum(pr, 0)",
        "            acc = acc * alpha + tl.sum(pr[:, None] * vv, 0)",
        "            m_i = m_new",
    ]
    if workspace is None:
        lines += [
            "    out = tl.where(l_i > 0, acc / l_i, 0.0)",
            f"    tl.store({p[spec.out.buffer]} + ({_offset(spec.out, ['b', 'h', '0', 'dv'])}), "
            f"out.to({tl_dtype(spec.out.layout.dtype)}), dv < {dv})"]
    else:
        w = p[workspace]
        lines += [
            f"    tl.store({w} + pid * {dv + 2}, m_i)",
            f"    tl.store({w} + pid * {dv + 2} + 1, l_i)",
            f"    tl.store({w} + pid * {dv + 2} + 2 + dv, acc, dv < {dv})"]
    return TritonKernel(name=name, source="\n".join(lines), pointer_args=tuple(ptrs), size_args=tuple(sizes),
                        xnumel=python_index(sympy.sympify(b * h * splits)),
                        xblock=1, rblock=0, num_warps=4, kind="decode_attention")


def combine_kernel(name: str, spec: DecodeSpec, splits: int, workspace: str) -> TritonKernel:
    """One program per (batch, head): its splits' results rescaled to the largest running max and added."""
    b, h, dv = spec.q.shape[0], int(spec.q.shape[1]), int(spec.v.shape[3])
    bs, bdv = _pow2(splits), _pow2(dv)
    ptrs = [workspace, spec.out.buffer]
    p = {x: ptr_name(x) for x in ptrs}
    sizes = _sizes(spec)
    params = [p[x] for x in ptrs] + [f'{z}: "{size_arg_type(z)}"' for z in sizes] + ["XBLOCK: tl.constexpr"]
    w = p[workspace]
    lines = [
        jit_decorator(sizes),
        f"def {name}({', '.join(params)}):",
        "    pid = tl.program_id(0).to(tl.int64)",
        f"    b = pid // {h}",
        f"    h = pid % {h}",
        f"    sp = tl.arange(0, {bs})",
        f"    dv = tl.arange(0, {bdv})",
        f"    row = (pid * {splits} + sp) * {dv + 2}",
        f"    m = tl.load({w} + row, sp < {splits}, other=float('-inf'))",
        f"    l_s = tl.load({w} + row + 1, sp < {splits}, other=0.0)",
        f"    acc = tl.load({w} + row[:, None] + 2 + dv[None, :], (sp[:, None] < {splits}) & (dv[None, :] < {dv}),"
        " other=0.0)",
        "    m_max = tl.max(m, 0)",
        "    scale = tl.where(m > float('-inf'), tl.exp(m - m_max), 0.0)  # a split with nothing unmasked adds 0",
        "    l_i = tl.sum(scale * l_s, 0)",
        "    out = tl.sum(scale[:, None] * acc, 0)",
        "    out = tl.where(l_i > 0, out / l_i, 0.0)",
        f"    tl.store({p[spec.out.buffer]} + ({_offset(spec.out, ['b', 'h', '0', 'dv'])}), "
        f"out.to({tl_dtype(spec.out.layout.dtype)}), dv < {dv})",
    ]
    return TritonKernel(name=name, source="\n".join(lines), pointer_args=tuple(ptrs), size_args=tuple(sizes),
                        xnumel=python_index(sympy.sympify(b * h)), xblock=1, rblock=0, num_warps=4,
                        kind="decode_attention")
