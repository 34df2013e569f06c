"""Block sizes and warp counts for generated Triton kernels (static choices; max-autotune may refine).

Pointwise kernels take up to 1024 elements a program (8 a thread at 4 warps). Row kernels are
persistent (the whole row in registers, RBLOCK = next_pow2(rnumel)) when the row is static and at most
``persistent_max`` long, else they loop over the row in RBLOCK chunks. A persistent row kernel that only
streams rows into per-row results (``streaming``: a one-row matmul, a row sum) takes fewer elements a
program at 16 a thread, so more programs keep loads in flight at once. When the reduced dim is not the
contiguous one (a column reduction), programs take a wide XBLOCK so loads stay coalesced along x.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """Options of the Triton code generator (part of generated code, so part of cache keys)."""

    persistent_max: int = 4096  # largest static row kept whole in registers
    target_programs: int = 528  # about four programs per SM of an H100/H200 (132 SMs)
    col_min_xblock: int = 8  # column reductions: at least this many contiguous x per tile row
    col_tile: int = 1024  # column reductions: XBLOCK * RBLOCK
    pointwise_block: int = 1024
    row_block_elems: int = 8192  # XBLOCK * RBLOCK of a row kernel
    # ... of a persistent row kernel storing per-row results only. decode's gate/up matmul (6144 x 1024
    # bf16, RMSNorm statistic recomputed in it) inside a CUDA graph on an H100: 12.8 us at 8 rows x 8 warps,
    # 11.1 at 2 rows x 4 warps with its weight loads issued first; q/k/v (3072 x 1024) 6.0 -> 5.0 us
    row_stream_elems: int = 2048
    looped_rblock: int = 2048
    max_xblock_rows: int = 64
    tile_block: int = 4096  # YBLOCK * XBLOCK of a 2-D (transposing) pointwise tile: 64 x 64
    # ... of a 2-D tile with more than tile_big_accesses loads + stores: 32 x 32, 8 elements a thread
    # at 4 warps (torch.compile's tile for square tiles). A 64 x 64 tile keeps 32 elements a thread of every
    # live value in registers: Llama-350M's backward fused the 24 layers' residual recompute into one
    # kernel (143 loads, 71 stores) that spilled and took triton 12-16 CPU s to compile (3.4 s at 32 x 32).
    tile_block_big: int = 1024
    tile_big_accesses: int = 16


@dataclass(frozen=True, slots=True)
class BlockChoice:
    xblock: int
    rblock: int  # 0 for pointwise kernels
    num_warps: int
    persistent: bool


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def prev_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def static(e: sympy.Expr) -> int | None:
    return int(e) if isinstance(e, (int, sympy.Integer)) else None


def _warps(elems: int) -> int:
    return max(1, min(8, elems // 256))


def pointwise_blocks(xnumel: sympy.Expr, cfg: TritonConfig) -> BlockChoice:
    n = static(xnumel)
    xblock = cfg.pointwise_block if n is None else max(16, min(cfg.pointwise_block, next_pow2(n)))
    return BlockChoice(xblock, 0, max(1, min(4, xblock // 128)), False)


def row_blocks(xnumel: sympy.Expr, rnumel: sympy.Expr, r_contiguous: bool, cfg: TritonConfig,
               rhint: int | None = None, streaming: bool = False) -> BlockChoice:
    """``rhint``: a symbolic row's length in the example inputs. It only sizes RBLOCK of the looped
    kernel (a short row does not loop over 2048-wide masked blocks); persistence needs a static row,
    so the kernel is correct for every length. ``streaming``: the kernel stores per-row results only."""
    xn, rn = static(xnumel), static(rnumel)
    xcap = next_pow2(xn) if xn is not None else cfg.max_xblock_rows
    if not r_contiguous:
        return _column_blocks(xn, rn, xcap, cfg, rhint)
    if rn is not None and rn <= cfg.persistent_max:
        rblock = next_pow2(rn)
        elems = cfg.row_stream_elems if streaming else cfg.row_block_elems
        xblock = max(1, min(xcap, cfg.max_xblock_rows, elems // rblock))
        warps = max(1, min(8, xblock * rblock // 512)) if streaming else _warps(xblock * rblock)
        return BlockChoice(xblock, rblock, warps, True)
    rsize = rn if rn is not None else (max(16, rhint) if rhint is not None else None)
    rblock = min(cfg.looped_rblock, next_pow2(rsize) if rsize is not None else cfg.looped_rblock)
    xblock = max(1, min(xcap, cfg.row_block_elems // 4 // rblock))
    return BlockChoice(xblock, rblock, _warps(xblock * rblock), False)


def _column_blocks(xn: int | None, rn: int | None, xcap: int, cfg: TritonConfig,
                   rhint: int | None = None) -> BlockChoice:
    """Reduce across rows of a contiguous x: wide-enough x for coalescing, enough programs to fill SMs.
    A symbolic column's example length sizes RBLOCK as a static one would (looped: right for every length)."""
    want = prev_pow2(max(1, xn // cfg.target_programs)) if xn is not None else cfg.max_xblock_rows
    xblock = max(1, min(xcap, cfg.max_xblock_rows, max(cfg.col_min_xblock, want)))
    if rn is not None and next_pow2(rn) * xblock <= cfg.col_tile:
        rblock = next_pow2(rn)
        return BlockChoice(xblock, rblock, _warps(xblock * rblock), True)
    rsize = rn if rn is not None else rhint
    rblock = max(8, min(next_pow2(rsize) if rsize is not None else 64, cfg.col_tile // xblock))
    return BlockChoice(xblock, rblock, _warps(xblock * rblock), False)


DEFAULT_CONFIG = TritonConfig()
