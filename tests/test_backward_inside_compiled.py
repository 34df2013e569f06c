"""``loss.backward()`` inside compiled code, more than once per call (gradient accumulation), and a
compiled graph given a tensor that requires grad but that no output depends on: every step against
eager, with fresh inputs.

Before: the graph after a ``backward()`` break took the dead ``loss`` local as an input, and its
``autograd.Function`` linked its output to that loss's graph (already freed by the first backward): the
second ``backward()`` raised "Trying to backward through the graph a second time" where eager ran. The
same for an unused argument that requires grad (and the link kept the old graph alive). And a matmul or
convolution made under ``torch.no_grad()`` from an input that requires grad came out requiring grad
(the graph's ATen calls recorded autograd history), where eager's does not."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "inductor"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _accumulate(m, opt, x, y):
    for i in range(2):  # two micro-batches, one backward each
        loss = torch.nn.functional.cross_entropy(m(x[i::2]), y[i::2]) / 2
        loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_accumulation_inside_one_compiled_step(backend):
    kiln.reset()
    ref, mine = _model(), _model()
    ref_opt, my_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2), torch.optim.AdamW(mine.parameters(), lr=1e-2)
    step = kiln.compile(_accumulate, backend=backend)
    for _ in range(4):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        torch.testing.assert_close(step(mine, my_opt, x, y), _accumulate(ref, ref_opt, x, y))
        for a, b in zip(mine.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b)


def _forward_backward_forward(m, x):
    loss = m(x).sum()
    loss.backward()
    return m(x * 2).mean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_after_a_backward_break_can_be_differentiated(backend):
    kiln.reset()
    ref, mine = _model(), _model()
    compiled = kiln.compile(_forward_backward_forward, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 8)
        got, want = compiled(mine, x), _forward_backward_forward(ref, x)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        for a, b in zip(mine.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        mine.zero_grad()
        ref.zero_grad()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unused_argument_that_requires_grad_is_not_linked(backend):
    m = _model()
    ref = copy.deepcopy(m)

    def f(model, x, unused):
        return model(x).sum()

    kiln.reset()
    compiled = kiln.compile(f, backend=backend)
    for _ in range(3):
        old = m(torch.randn(2, 8)).sum()
        old.backward()  # its graph is freed
        m.zero_grad()
        x = torch.randn(2, 8)
        out = compiled(m, x, old)
        assert old.grad_fn not in [fn for fn, _ in out.grad_fn.next_functions]
        out.backward()
        f(ref, x, None).backward()
        for a, b in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        ref.zero_grad()
        m.zero_grad()


_W = torch.randn(3, 3)


def _no_grad_matmul(x):
    with torch.no_grad():
        y = x @ _W
    return y, y * 2


def _no_grad_conv(x):
    with torch.no_grad():
        y = torch.nn.functional.conv1d(x.view(1, 1, 3), torch.ones(1, 1, 2))
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_no_grad_matmul, _no_grad_conv], ids=["matmul", "conv"])
def test_outputs_made_under_no_grad_do_not_require_grad(backend, fn):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        x = torch.randn(3, requires_grad=True)
        got, want = compiled(x), fn(x)
        torch.testing.assert_close(got, want)
        for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            assert g.requires_grad == w.requires_grad is False and g.grad_fn is None
