"""Shared test helpers: trace a function, compile it with kiln.inductor, compare with eager."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tracer import flat_outputs, trace

from kiln.graph import CompiledGraph
from kiln.inductor import InductorOptions, compile_graph

STRICT = InductorOptions(strict_lowering=True)


def compile_fn(fn: Any, *args: Any, options: InductorOptions = STRICT) -> CompiledGraph:
    return compile_graph(trace(fn, *args), list(args), options=options)


def assert_close(got: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        assert got.shape == want.shape, (got.shape, want.shape)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype in (torch.bfloat16, torch.float16):
            atol, rtol = max(atol, 2e-2), max(rtol, 2e-2)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True, check_stride=False)
    else:
        assert got == want, (got, want)


def check(fn: Any, *args: Any, atol: float = 1e-5, rtol: float = 1e-4,
          options: InductorOptions = STRICT) -> CompiledGraph:
    """Compile ``fn`` for ``args``, run it, and compare every output with eager."""
    cg = compile_fn(fn, *args, options=options)
    got = cg.fn(*args)
    with torch.no_grad():
        want = flat_outputs(fn(*args))
    assert isinstance(got, tuple)
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert_close(g, w, atol, rtol)
    return cg


def run_portable(cg: CompiledGraph, tmp_path: Any, args: list) -> tuple:
    """What kiln.runtime does with a saved program: write FILES to a folder, exec the source with
    FILES_DIR, call it."""
    assert cg.portable is not None
    for name, data in cg.portable.files.items():
        (tmp_path / name).write_bytes(data)
    ns: dict = {"FILES_DIR": str(tmp_path), "FILES": dict(cg.portable.files)}
    exec(compile(cg.portable.source, "<portable>", "exec"), ns)
    return ns["call"](args)  # type: ignore[no-any-return]


def n_kernels(cg: CompiledGraph) -> int:
    return len(cg.scheduled.kernels())  # type: ignore[attr-defined]


def transformer_blocks(n: int):
    """n blocks of LayerNorm -> linear+gelu -> linear + residual over (x, *weights) (autotune tests)."""
    def fn(x, *wb):
        for i in range(n):
            h = F.gelu(F.linear(F.layer_norm(x, x.shape[-1:]), wb[4 * i], wb[4 * i + 1]))
            x = x + F.linear(h, wb[4 * i + 2], wb[4 * i + 3])
        return (x,)
    return fn
