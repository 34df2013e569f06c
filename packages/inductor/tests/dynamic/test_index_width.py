"""32-bit indices in symbolic Triton kernels (index_width.py): one extent guard in the ShapeEnv, the
kernels' size arguments narrowed to i32, right values at every size; 64 bits (and no guard) where the
example sizes leave no room or an extent is not an expression of sizes."""

from __future__ import annotations

import logging

import pytest
import torch
from dynamic_helpers import TRITON, check_sizes, needs_triton, symbolic_graph

from kiln.inductor import compile_graph
from kiln.inductor.index_width import index_guard


def _scale_relu_sums(x, w):  # an NCHW per-channel scale: a channel index divided out of the flat one
    y = torch.relu(x * w[None, :, None, None] + 1)
    return y, y.sum((0, 2, 3))


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 3, n + 3, n + 3, generator=g), torch.randn(3, generator=g)


def _env(examples):
    return examples[0].shape[0].node.shape_env


def _compile(caplog, options):
    """The NCHW graph compiled with batch and image sizes symbolic, and the ShapeEnv guards it added."""
    gm, examples = symbolic_graph(_scale_relu_sums, *_inputs(4), dynamic={0: (0, 2, 3)})
    env = _env(examples)
    before = len(env.guards)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        cg = compile_graph(gm, examples, options=options)
    return cg, [str(g.expr) for g in env.guards[before:]]


@needs_triton
def test_symbolic_kernels_index_in_32_bits_under_one_guard(caplog):
    cg, added = _compile(caplog, TRITON)
    assert "kernels index in 32 bits" in caplog.text
    assert any("<= 1073741824" in g for g in added), added  # the caller (capture) checks it before each call
    assert any("<= 1073741824" in g for g in cg.size_guards)  # and the wrapper after
    code = cg.texts["output_code"]
    assert ".to(tl.int32)" in code and "program_id(0).to(tl.int64)" not in code
    check_sizes(cg, _scale_relu_sums, _inputs, (4, 7, 1, 2, 13))


@needs_triton
def test_example_sizes_near_the_limit_keep_64_bit_indices(caplog):
    cg, added = _compile(caplog, TRITON.replace(index32_limit=400))  # 588 elements at the example sizes
    assert "kernels index in 64 bits" in caplog.text
    assert not added
    assert ".to(tl.int32)" not in cg.texts["output_code"]
    check_sizes(cg, _scale_relu_sums, _inputs, (4, 9))


def test_extents_that_are_not_sizes_give_no_guard():
    """A size that is a difference of sizes (``x[y.shape[0]:]``) does not grow with every size: its
    value at the example sizes bounds nothing, so no 32-bit guard is made from it."""
    gm, examples = symbolic_graph(lambda x, y: (x[y.shape[0]:] * 2,), torch.randn(10), torch.randn(3))
    env = _env(examples)
    before = len(env.guards)
    assert index_guard(gm, examples, 2**30) is None
    assert len(env.guards) == before


def test_static_graphs_give_no_guard():
    from tracer import trace
    x = torch.randn(4, 3)
    assert index_guard(trace(lambda x: (x * 2,), x), [x], 2**30) is None


@pytest.fixture(autouse=True)
def _perf_hints_propagate():
    logger = logging.getLogger("kiln.perf_hints")
    old = logger.propagate
    logger.propagate = True
    yield
    logger.propagate = old


def test_a_declared_maximum_is_served_whole():
    """A size range the caller declared (mark_dynamic's max, kiln.export's dynamic_shapes): 32-bit indices
    only when the whole range fits, never a guard that cuts the range short."""
    x = torch.randn(8, 3)
    for top, fits in ((1000, True), (10**9, False)):
        gm, examples = symbolic_graph(lambda x: (x * 2,), x, dynamic={0: (0,)})
        env = _env(examples)
        sym = examples[0].shape[0].node.expr
        env.constrain_symbol_range(sym, compiler_min=2, compiler_max=top)
        before = len(env.guards)
        assert (index_guard(gm, examples, 2**30) is not None) is fits
        assert all("1073741824" not in str(g.expr) for g in env.guards[before:])  # implied by the range, or none
