"""Op-level tests: one compile with symbolic sizes serves every size (0, 1, primes), on the C++ path and
the Triton interpreter, compared with eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import BACKENDS, SIZES, check_sizes, compile_symbolic, is_dynamic

torch.manual_seed(0)


def _run(fn, make_args, options, sizes=SIZES, example=37, **tol):
    cg = compile_symbolic(fn, *make_args(example), options=options)
    assert is_dynamic(cg), cg.loop_program.as_text()
    check_sizes(cg, fn, make_args, sizes, **tol)
    return cg


@pytest.mark.parametrize("options", BACKENDS)
def test_pointwise_chain(options):
    def fn(x, y):
        return (torch.sigmoid(x * 2 + y).tanh() - x.abs(),)
    _run(fn, lambda n: (torch.randn(n, 6), torch.randn(n, 6)), options)


@pytest.mark.parametrize("options", BACKENDS)
def test_two_symbolic_dims_broadcast(options):
    def fn(x, b):
        return (x + b, (x * b).relu())
    _run(fn, lambda n: (torch.randn(n, n + 3), torch.randn(n + 3)), options, sizes=(2, 3, 5, 11, 40))


@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("op", ["sum_last", "sum_first", "mean", "amax", "softmax", "log_softmax"])
def test_reductions_over_symbolic_dim(options, op):
    fns = {"sum_last": lambda x: (x.sum(-1),), "sum_first": lambda x: (x.sum(0),),
           "mean": lambda x: (x.mean(-1, keepdim=True), x.mean()), "amax": lambda x: (x.amax(-1),),
           "softmax": lambda x: (torch.softmax(x, -1),), "log_softmax": lambda x: (F.log_softmax(x, 0),)}
    sizes = (2, 3, 1, 7, 13, 64, 97) if op in ("amax", "softmax", "log_softmax") else SIZES
    _run(fns[op], lambda n: (torch.randn(4, n) if op != "sum_first" else torch.randn(n, 4),), options, sizes=sizes)


@pytest.mark.parametrize("options", BACKENDS)
def test_layer_norm_over_symbolic_rows_and_features(options):
    def fn(x, w, b):
        return (F.layer_norm(x, x.shape[-1:], w, b),)
    _run(fn, lambda n: (torch.randn(3, n, n + 2), torch.randn(n + 2), torch.randn(n + 2)), options,
         sizes=(2, 3, 5, 31), atol=1e-4)


@pytest.mark.parametrize("options", BACKENDS)
def test_matmul_extern_and_epilogue(options):
    def fn(x, w, b):
        return (torch.relu(x @ w + b),)
    _run(fn, lambda n: (torch.randn(n, 8), torch.randn(8, 5), torch.randn(5)), options, atol=1e-4)


@pytest.mark.parametrize("options", BACKENDS)
def test_views_and_reshapes(options):
    def fn(x):
        b, t, c = x.shape
        y = x.view(b * t, c) * 2
        z = x.transpose(0, 1).reshape(t, b * c)
        return (y.view(b, t, c) + 1, z, x.flatten().sin())
    _run(fn, lambda n: (torch.randn(n, 3, 4),), options)


@pytest.mark.parametrize("options", BACKENDS)
def test_non_contiguous_input(options):
    def fn(x):
        return (x * 3 + 1, x.sum(1))
    _run(fn, lambda n: (torch.randn(6, n).t(),), options)


@pytest.mark.parametrize("options", BACKENDS)
def test_embedding_and_gather(options):
    def fn(idx, table, x):
        return (F.embedding(idx, table) * 2, torch.gather(x, 1, idx.view(-1, 1) % x.shape[1]))
    _run(fn, lambda n: (torch.randint(0, 10, (n,)), torch.randn(10, 4), torch.randn(n, 3)), options)


@pytest.mark.parametrize("options", BACKENDS)
def test_slice_and_cat(options):
    def fn(x):
        return (torch.cat([x, x[:, 1:] * 2], 1), x[1:, :2] + 1)
    _run(fn, lambda n: (torch.randn(n + 1, n + 2),), options, sizes=(2, 3, 5, 11))


@pytest.mark.parametrize("options", BACKENDS)
def test_symbolic_int_input(options):
    def fn(x, k):
        return (x * k + x.shape[0],)
    cg = compile_symbolic(fn, torch.randn(5, 3), 7, options=options)
    for n, k in ((2, 3), (9, 11), (4, 7)):
        x = torch.randn(n, 3)
        torch.testing.assert_close(cg.fn(x, k)[0], fn(x, k)[0])
