"""A kernel group (scheduler/horizontal.py) as one Triton launch.

Each part is written as a ``@triton.jit`` function taking its program index (``pid``) where a kernel
reads ``tl.program_id(0)``, with its own block size; the group's kernel splits its programs between
the parts in order::

    @triton.jit
    def group0(ptr_buf22, ptr_arg1, ptr_buf23, ptr_buf24, XBLOCK: tl.constexpr):
        pid = tl.program_id(0)
        if pid < 1:
            k13_index_put__scatter(ptr_buf22, ptr_arg1, ptr_buf23, pid, 1024)
        else:
            k14_index_put__scatter(ptr_buf22, ptr_arg1, ptr_buf24, pid - 1, 1024)

A part runs exactly the programs it would run alone, so anything correct as its own launch is correct
as a part: the scheduler only groups parts that touch nothing another part writes. (The group's
``XBLOCK`` is 1: its grid is the parts' program counts added up.) A part whose code is not one flat
launch (a scatter with an initial copy, a 2-D tiled transpose) is launched alone, after the group.
"""

from __future__ import annotations

import sympy

from ...ir import Kernel, KernelGroup
from ...ir.index import product
from ...scheduler.horizontal import groupable, is_inplace_scatter
from .heuristics import DEFAULT_CONFIG, TritonConfig
from .kernel import (
    TritonKernel,
    generate_kernel,
    generate_kernels,
    jit_decorator,
    ptr_name,
    size_arg_type,
    split_scatter,
    tile_split,
)
from .printer import IndexPrinter
from .tiling import simplify_kernel

# pointer and size arguments of one group kernel: triton compiles a group as one function (the parts are
# inlined calls), so a long group is a long serial compile where its parts alone compile in parallel
TRITON_GROUP_PARAMS = 128


def groupable_triton(k: object) -> bool:
    """What a Triton group may hold: a 1-D pointwise kernel, or a scatter written in place (one launch over
    its source space). Not a kernel that brings its own Triton code (a max-autotune matmul template)."""
    if type(k) is not Kernel:
        return False
    return is_inplace_scatter(k) or (groupable(k) and tile_split(simplify_kernel(k)) is None)


def _programs(part: TritonKernel, numel: sympy.Expr) -> tuple[str, str]:
    """The part's program count as (Triton code, Python code)."""
    if numel.is_number:
        n = str(-(-int(numel) // part.xblock))
        return n, n
    return (f"(({IndexPrinter()(numel)}) + {part.xblock - 1}) // {part.xblock}",
            f"(-(-({part.xnumel}) // {part.xblock}))")


def generate_group(g: KernelGroup, cfg: TritonConfig = DEFAULT_CONFIG, hints: dict[str, int] | None = None,
                   index32: bool = False) -> list[TritonKernel]:
    """The launches of ``g``: one kernel for its flat parts (two or more), then any other part's own."""
    flat: list[tuple[Kernel, Kernel, sympy.Expr]] = []  # (part, its flat launch, element count)
    alone: list[TritonKernel] = []
    for k in g.parts:
        if not groupable_triton(k):
            alone += generate_kernels(k, cfg, hints, index32)
            continue
        (target,) = split_scatter(k) if k.inner else (k,)
        numel = sympy.sympify(product(list(target.outer)))
        if numel != 0:  # an empty part runs nothing
            flat.append((k, target, numel))
    if len(flat) < 2:
        return [t for k, _, _ in flat for t in generate_kernels(k, cfg, hints, index32)] + alone
    parts = [(generate_kernel(t, cfg, hints, index32, part=True), n) for _, t, n in flat]
    return [_group_kernel(g.name, parts), *alone]


def _group_kernel(name: str, parts: list[tuple[TritonKernel, sympy.Expr]]) -> TritonKernel:
    pointers = tuple(dict.fromkeys(b for p, _ in parts for b in p.pointer_args))
    sizes = tuple(dict.fromkeys(s for p, _ in parts for s in p.size_args))
    params = [ptr_name(b) for b in pointers] + [f'{s}: "{size_arg_type(s)}"' for s in sizes] + ["XBLOCK: tl.constexpr"]
    body = ["    pid = tl.program_id(0)"]
    start_tl, start_py = "0", []
    for i, (p, numel) in enumerate(parts):
        n_tl, n_py = _programs(p, numel)
        args = [ptr_name(b) for b in p.pointer_args] + list(p.size_args)
        local = "pid" if i == 0 else f"pid - ({start_tl})"
        call = f"{p.name}({', '.join(args + [local, str(p.xblock)])})"
        if i == 0:
            end_tl = n_tl
        else:
            end_tl = str(int(start_tl) + int(n_tl)) if start_tl.isdigit() and n_tl.isdigit() else f"{start_tl} + {n_tl}"
        if i == len(parts) - 1:
            body += ["    else:", f"        {call}"]
        else:
            body += [f"    {'if' if i == 0 else 'elif'} pid < {end_tl}:", f"        {call}"]
        start_tl = end_tl
        start_py.append(n_py)
    source = "\n\n\n".join([*(p.source for p, _ in parts),
                            "\n".join([jit_decorator(sizes), f"def {name}({', '.join(params)}):", *body])])
    static = all(n.is_number for _, n in parts)
    total = str(sum(int(n) for n in start_py)) if static else " + ".join(start_py)
    return TritonKernel(name=name, source=source, pointer_args=pointers, size_args=sizes, xnumel=total, xblock=1,
                        rblock=0, num_warps=max(p.num_warps for p, _ in parts), kind="pointwise_group",
                        helpers=tuple(p.name for p, _ in parts))
