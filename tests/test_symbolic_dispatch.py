"""A composite op whose C++-style kernel reads sizes as ints must not pin a dynamic size.

torch 2.11's C++ ``matmul`` of CUDA tensors and 3-d ``linear`` without bias do this on a machine with
a GPU (a batched matmul specialised the batch of every HF Llama request; the linear raised). Their
Python rules, reached through the Python dispatcher, keep SymInts. The op below reproduces that on
any machine: its CompositeImplicitAutograd kernel reads ``int(x.shape[0])`` (a plain-int read, as C++
``sizes()``), while its Python-dispatcher rule is symbolic. Every stage that traces with symbolic
sizes (capture, autograd's forward and backward, decomposition) must take the symbolic rule.
"""

from __future__ import annotations

import pytest
import torch
from torch._C import DispatchKey

import kiln

_LIB = torch.library.Library("kiln_symtest", "DEF")
_LIB.define("rowsum_scaled(Tensor x) -> Tensor")
INT_READS: list[int] = []  # sizes read as ints while tracing symbolically


def _reads_int(x: torch.Tensor) -> torch.Tensor:
    if isinstance(x.shape[0], torch.SymInt):
        INT_READS.append(int(x.shape[0]))  # the plain-int read that specialises a symbolic size
    n = int(x.shape[0])
    return x.sum(1) / n + x[:, 0]


def _symbolic(x: torch.Tensor) -> torch.Tensor:
    return x.sum(1) / x.shape[0] + x[:, 0]


_LIB.impl("rowsum_scaled", _reads_int, "CompositeImplicitAutograd")
torch.ops.kiln_symtest.rowsum_scaled.default.py_impl(DispatchKey.CompositeImplicitAutograd)(_symbolic)


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.kiln_symtest.rowsum_scaled(torch.tanh(x @ w)) * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_composite_int_read_does_not_pin_a_dynamic_size(backend: str) -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    compiled = kiln.compile(_fn, backend=backend, dynamic=True)
    kiln.stats_reset()
    INT_READS.clear()
    for n in (3, 5, 7, 11, 2, 13):  # fresh inputs, several sizes, each called twice
        for _ in range(2):
            x = torch.randn(n, 8, requires_grad=True)
            xe = x.detach().clone().requires_grad_(True)
            we = w.detach().clone().requires_grad_(True)
            out = compiled(x, w)
            ref = _fn(xe, we)
            torch.testing.assert_close(out, ref)
            out.sum().backward()
            ref.sum().backward()
            torch.testing.assert_close(x.grad, xe.grad)
            torch.testing.assert_close(w.grad, we.grad)
            w.grad = None
    stats = kiln.stats()
    assert stats.graphs_compiled == 1, stats
    assert stats.frames_run_eagerly == 0 and stats.graphs_run_eagerly == 0, stats
    assert INT_READS == [], f"a symbolic trace read a size as an int: {INT_READS}"


def _scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ w)
    return (y.sum(1) * (1.0 / y.shape[0]) + y[:, 0]) * 2


def test_float_size_expression_saved_for_backward() -> None:
    """``1.0 / n`` of a symbolic size is a SymFloat the backward needs: the partitioner recomputes it
    from the saved size (it used to find no cut), and decomposition rebuilds it as graph nodes."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    compiled = kiln.compile(_scaled, backend="aot_eager", dynamic=True)
    kiln.stats_reset()
    for n in (3, 5, 7, 3):
        x = torch.randn(n, 8, requires_grad=True)
        xe = x.detach().clone().requires_grad_(True)
        out, ref = compiled(x, w), _scaled(xe, w)
        torch.testing.assert_close(out, ref)
        (gx,) = torch.autograd.grad(out.sum(), x)
        (gxe,) = torch.autograd.grad(ref.sum(), xe)
        torch.testing.assert_close(gx, gxe)
    assert kiln.stats().graphs_compiled == 1
