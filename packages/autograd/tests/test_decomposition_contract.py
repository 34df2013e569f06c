"""kiln.decomp's contract: a decomposition that returns NotImplemented keeps the op as it is; a view op's
decomposition that copies is traced as the view."""

from __future__ import annotations

import torch
from torch import fx

import kiln.autograd as autograd

aten = torch.ops.aten


def test_not_implemented_keeps_the_op_in_forward_and_backward() -> None:
    seen = []

    def maybe_view(x, size):
        seen.append(tuple(size))
        return NotImplemented

    gm = fx.symbolic_trace(lambda x, w: (x @ w).view(-1).sin())
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    joint = autograd.trace_joint(gm, [x, w], decompositions={aten.view.default: maybe_view})
    assert seen, "the decomposition was consulted"
    assert any(n.target is aten.view.default for n in joint.gm.graph.nodes)


def test_real_decomposition_replaces_the_op() -> None:
    def sin_as_cos(x):
        return aten.cos.default(aten.sub.Tensor(x, torch.pi / 2))

    gm = fx.symbolic_trace(lambda x: x.sin())
    compiled = autograd.aot_eager(gm, [torch.randn(4)], decompositions={aten.sin.default: sin_as_cos})
    x = torch.randn(4)
    out = compiled(x)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, x.sin())


def _transpose_as_copy(x, dim0, dim1):
    perm = list(range(x.dim()))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return aten.clone.default(aten.permute.default(x, perm))


def _write_through_transpose(x):
    x.transpose(0, 1)[0].mul_(10)
    return x + 1


def test_a_view_decomposed_into_a_copy_still_writes_its_base() -> None:
    """A table entry that computes a view op as a copy (as unfold's gather does): a write through the view
    reaches the caller's tensor, on every call with fresh inputs (it reached the copy: ``x`` kept its values)."""
    gm = fx.symbolic_trace(_write_through_transpose)
    compiled = autograd.aot_eager(gm, [torch.randn(3, 4)], decompositions={aten.transpose.int: _transpose_as_copy})
    for _ in range(3):
        x = torch.randn(3, 4)
        expected_x = x.clone()
        expected = _write_through_transpose(expected_x)
        out = compiled(x)
        torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, expected)
        torch.testing.assert_close(x, expected_x)
