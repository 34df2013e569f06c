"""Test helpers for symbolic-shape graphs: trace with torch's symbolic make_fx (tests may use it as the
reference front end), decompose with kiln.decomp's inductor table, compile, and compare with eager."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln.decomp as decomp
from kiln.graph import CompiledGraph
from kiln.inductor import InductorOptions, compile_graph, inductor_decompositions

CPP = InductorOptions(strict_lowering=True)
TRITON = InductorOptions(strict_lowering=True, cpu_backend="triton")

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1")
BACKENDS = [pytest.param(CPP, id="cpp"), pytest.param(TRITON, id="triton", marks=needs_triton)]


def symbolic_graph(fn: Callable[..., Any], *args: Any) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``fn`` traced with symbolic sizes (every tensor dim and int argument a symbol, as torch traces
    ``dynamic=True``), decomposed as kiln's backend hands graphs to compile_graph; and its example inputs
    (the placeholders' fake tensors and SymInts)."""
    gm = make_fx(fn, tracing_mode="symbolic")(*args)
    gm = decomp.decompose(gm, inductor_decompositions(), check=False)
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, examples


def compile_symbolic(fn: Callable[..., Any], *args: Any, options: InductorOptions = CPP) -> CompiledGraph:
    gm, examples = symbolic_graph(fn, *args)
    cg = compile_graph(gm, examples, options=options)
    assert cg.backend == "inductor", cg.texts.get("fallbacks")
    return cg


def flat(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def check_sizes(cg: CompiledGraph, fn: Callable[..., Any], make_args: Callable[[int], tuple],
                sizes: Iterable[int], atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """One compiled graph called with inputs of every size (fresh inputs each call) matches eager."""
    for n in sizes:
        args = make_args(n)
        got = cg.fn(*args)
        want = flat(fn(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert g.shape == w.shape, (n, g.shape, w.shape)
                assert g.dtype == w.dtype, (n, g.dtype, w.dtype)
                torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True, check_stride=False,
                                           msg=lambda m, n=n: f"size {n}: {m}")
            else:
                assert g == w, (n, g, w)


def is_dynamic(cg: CompiledGraph) -> bool:
    """The program reads sizes from its inputs and assumed nothing about them."""
    p = cg.loop_program  # type: ignore[attr-defined]
    return bool(p.sizes) and not p.size_guards


SIZES = (2, 3, 1, 0, 7, 13, 64, 97)
