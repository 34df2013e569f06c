"""Test helpers for symbolic-shape graphs: trace with torch's symbolic make_fx (tests may use it as the
reference front end), decompose with kiln.decomp's inductor table, compile, and compare with eager."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import kiln.decomp as decomp
from kiln.graph import CompiledGraph, symbolic_dispatch
from kiln.inductor import InductorOptions, compile_graph, inductor_decompositions
from kiln.inductor.index_width import INDEX32_REASON

CPP = InductorOptions(strict_lowering=True)
TRITON = InductorOptions(strict_lowering=True, cpu_backend="triton")

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1")
BACKENDS = [pytest.param(CPP, id="cpp"), pytest.param(TRITON, id="triton", marks=needs_triton)]


def symbolic_graph(fn: Callable[..., Any], *args: Any,
                   dynamic: dict[int, tuple[int, ...]] | None = None) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``fn`` traced with symbolic sizes, decomposed as kiln's backend hands graphs to compile_graph;
    and its example inputs (the placeholders' fake tensors and SymInts). Without ``dynamic`` every
    tensor dim and int argument is a symbol (as torch traces ``dynamic=True``); with it, only those
    dims of those arguments (``{0: (0, 1)}``: dims 0 and 1 of the first), over one ShapeEnv, the rest
    static (weights, as kiln.capture marks parameters)."""
    if dynamic is None:
        gm = make_fx(fn, tracing_mode="symbolic")(*args)
    else:
        mode = FakeTensorMode(shape_env=ShapeEnv())
        fakes = []
        for k, a in enumerate(args):
            dims = dynamic.get(k, ())
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
                                                          for d in range(a.dim())])
            fakes.append(mode.from_tensor(a, symbolic_context=ctx))
        # the Python dispatcher, as make_fx's symbolic mode and kiln's tracers use it: torch 2.11's C++
        # matmul of a 3-D by a 2-D tensor (F.linear without bias) asks for numel() and fails otherwise
        with mode, symbolic_dispatch(True):
            gm = make_fx(fn, tracing_mode="real")(*fakes)
    gm = decomp.decompose(gm, inductor_decompositions(), check=False)
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, examples


def symbolic_fakes_graph(fn: Callable[..., Any], shapes: list[tuple[int, ...]], dynamic: dict[int, tuple[int, ...]],
                         device: str, dtype: torch.dtype) -> tuple[torch.fx.GraphModule, list[Any], ShapeEnv]:
    """``fn`` traced on fake tensors of ``shapes`` on ``device`` (a CUDA build makes fake CUDA tensors
    without a GPU), the dims in ``dynamic`` symbolic over one ShapeEnv, decomposed as kiln's backend
    hands graphs to compile_graph; its example inputs; the ShapeEnv (to check what the trace assumed)."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    fakes = []
    for k, shape in enumerate(shapes):
        dims = dynamic.get(k, ())
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
                                                      for d in range(len(shape))])
        meta = mode.from_tensor(torch.empty(shape, device="meta"), symbolic_context=ctx)
        with mode:
            fakes.append(torch.empty(meta.shape, device=device, dtype=dtype))
    with mode, enable_python_dispatcher():
        gm = make_fx(fn, tracing_mode="real")(*fakes)
    gm = decomp.decompose(gm, inductor_decompositions(), check=False)
    return gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"], env


def compile_symbolic(fn: Callable[..., Any], *args: Any, options: InductorOptions = CPP,
                     dynamic: dict[int, tuple[int, ...]] | None = None) -> CompiledGraph:
    gm, examples = symbolic_graph(fn, *args, dynamic=dynamic)
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


def assumed(program: Any) -> list:
    """The size guards a compile added beyond the 32-bit index range of Triton kernels (index_width.py)."""
    return [g for g in program.size_guards if g.reason != INDEX32_REASON]


def is_dynamic(cg: CompiledGraph) -> bool:
    """The program reads sizes from its inputs and assumed nothing about them (but a 32-bit index range)."""
    p = cg.loop_program  # type: ignore[attr-defined]
    return bool(p.sizes) and not assumed(p)


SIZES = (2, 3, 1, 0, 7, 13, 64, 97)
