"""Which kernels of a CUDA graph compile ahead of the first call, for which target (kiln/inductor/compile_pool.py).

Every generated kernel is one job per distinct (function, pointer dtypes, size arguments, constexprs,
warps, stages), queued longest first: kernels sharing one function (dedup.py) with the same launch config are
one job, a twin with its own (max-autotune tuned) config is another. Kernels with symbolic sizes are
jobs like the others: their size arguments are declared unspecialised (kernel.py SIZE_ARG_TYPE), so the
binary compiled here, before any size is known, is the one every first launch looks up, whatever its sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...compile_pool import (
    PROCESS_POOL,
    CompileBatch,
    TritonCompilePool,
    TritonJob,
    device_target,
    in_process,
    parse_target,
)
from ...ir import Layout
from ...knobs import KNOBS, triton_interpret
from .kernel import TritonKernel, size_arg_type
from .wrapper import load_triton_module, module_source


def launch_constants(k: TritonKernel) -> dict[str, int]:
    """The constexprs ``k``'s launcher passes (a matmul template's are in its source: none)."""
    if k.kind == "mm_template":
        return {}
    return {"XBLOCK": k.xblock, **({"RBLOCK": k.rblock} if k.rblock else {}),
            **({"YBLOCK": k.yblock} if k.yblock else {})}


def kernel_jobs(kernels: Sequence[TritonKernel], layouts: Mapping[str, Layout], path: str,
                module: str) -> list[TritonJob]:
    jobs: dict[TritonJob, TritonJob] = {}  # job (builds_launcher left True) -> as queued
    size: dict[TritonJob, int] = {}
    signatures: set[tuple[Any, ...]] = set()
    for k in kernels:
        if not all(b in layouts for b in k.pointer_args):
            continue
        dtypes = tuple(str(layouts[b].dtype).removeprefix("torch.") for b in k.pointer_args)
        consts = tuple(sorted(launch_constants(k).items()))
        job = TritonJob(path, module, k.function or k.name, dtypes, consts, k.num_warps,
                        int(getattr(k, "num_stages", 1)), sizes=len(k.size_args))
        if job in jobs:
            continue
        # size arguments by declared type (i64 sizes, fp64 float arguments): C launchers differ per type
        arg_types = tuple(size_arg_type(s) for s in k.size_args)
        signature = (dtypes, arg_types, tuple(c for c, _ in consts), k.kind == "mm_template")
        jobs[job] = dataclasses.replace(job, builds_launcher=signature not in signatures)
        size[jobs[job]] = len(k.source) * int(getattr(k, "num_stages", 1))
        signatures.add(signature)
    # longest first (source size as the guess): a big reduction or matmul template queued last would
    # leave the other workers idle while it compiles
    return sorted(jobs.values(), key=lambda j: -size[j])


def compile_target(device: str) -> tuple[tuple[str, Any, int] | None, bool]:
    """(target, cross): this process's GPU's, or ``KILN_TRITON_CROSS_TARGET`` without one; None: nothing
    to compile ahead (not CUDA, the interpreter, or no GPU and no cross target)."""
    if device != "cuda" or triton_interpret():
        return None, False
    if torch.cuda.is_available():
        return device_target(), False
    if KNOBS.triton_cross_target:
        return parse_target(KNOBS.triton_cross_target), True
    return None, False


def compile_ahead(kernels: Sequence[TritonKernel], layouts: Mapping[str, Layout], device: str,
                  label: str = "a graph", pool: TritonCompilePool = PROCESS_POOL) -> CompileBatch | None:
    """Hand the kernels to ``pool``; None when the wrapper's own precompile should run instead
    (no pool on a GPU: its thread pool; or nothing to compile ahead)."""
    target, cross = compile_target(device)
    if target is None or not kernels:
        return None
    source = module_source(kernels)
    module = load_triton_module(source)  # written to its file for the workers
    jobs = kernel_jobs(kernels, layouts, str(module.__file__), module.__name__)
    if not jobs:
        return None
    label = f"{label} ({len(jobs)} kernel specialisations)"
    batch = pool.submit(jobs, target, label)
    if batch is None and cross:  # the cross-compile still compiles, here (the measurement stays honest)
        batch = in_process(jobs, target, label)
    return batch


def warm_compile_pool(device: str = "cuda", pool: TritonCompilePool = PROCESS_POOL) -> bool:
    """Start the Triton compile workers now, in the background, when graphs for ``device`` will compile
    Triton kernels here (a GPU, or ``KILN_TRITON_CROSS_TARGET``); True when there is a pool. kiln.compile
    may call this before capture so the workers' imports overlap it; compile_graph calls it on entry."""
    target, _ = compile_target(device)
    return target is not None and pool.warm(target)
