"""A graph break inside ``torch.autocast`` (or a grad-mode block) counts once, as torch.compile counts it:
the resume function models the end of the block the previous frame entered (no second break there),
and the caller's autocast and grad state after the call is what eager leaves. Outputs, dtypes and state
compared with eager over fresh inputs; graph and break counts with ``torch._dynamo.explain``."""

from __future__ import annotations

import pytest
import torch

import kiln


@torch.compiler.disable
def _opaque(t):
    return t * 1


def inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ x.T
        a = _opaque(a)
        b = a @ x
    return b.float() + 1, b.dtype


def returns_inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _opaque(x @ x.T)
        return (y @ y).float()


def nested(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            a = x @ x.T
            a = _opaque(a)
            b = a @ x
        c = b @ x.T
    return c.float() * 2, b.dtype, c.dtype


def two_blocks(x):
    """A second block entered after the first one ends, with a break of its own: the first block's real
    exit runs before the second block is entered again for the breaking call."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = _opaque(x @ x.T)
        b = a @ x
    c = b.float() @ x.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d = _opaque(c @ x)
        e = d @ x.T
    return e.float() + c.sum(), a.dtype, c.dtype, torch.is_autocast_enabled("cpu")


def with_no_grad(x):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = _opaque(x @ x.T)
        b = a @ x
    return b.float() + x, torch.is_grad_enabled()


def no_grad_only(x):
    with torch.no_grad():
        a = _opaque(x * 2)
        b = a * 3
    return b + x, torch.is_grad_enabled()


PROGRAMS = [inside, returns_inside, nested, two_blocks, with_no_grad, no_grad_only]


def _state():
    return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


def _torch_counts(fn, x):
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(x)
    return ex.graph_count, ex.graph_break_count


@pytest.mark.parametrize("fn", PROGRAMS, ids=[f.__name__ for f in PROGRAMS])
def test_one_break_per_break_as_torch_counts(fn):
    kiln.reset()
    x = torch.randn(6, 6)
    ex = kiln.explain(fn)(x)
    assert (ex.graph_count, ex.break_count) == _torch_counts(fn, x), ex.as_text()
    assert ex.break_count == len(ex.break_reasons) == str(ex).count("\n  break ")
    assert all("leaving a torch.autocast" not in r.reason for r in ex.break_reasons), ex.as_text()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=[f.__name__ for f in PROGRAMS])
def test_outputs_and_state_match_eager(fn, backend):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    before = _state()
    for call in range(3):
        torch.manual_seed(call)  # fresh inputs every call, the same every run
        x = torch.randn(6, 6, requires_grad=True)
        got, want = compiled(x), fn(x)
        assert _state() == before
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert g.dtype == w.dtype and g.requires_grad == w.requires_grad
                torch.testing.assert_close(g, w, atol=1e-1, rtol=5e-2)  # bf16 matmuls, rounded at other points
            else:
                assert g == w
        if got[0].requires_grad:
            gx, = torch.autograd.grad(got[0].sum(), x)
            wx, = torch.autograd.grad(want[0].sum(), x)
            # bf16 products summed with cancellation: an element's error scales with the largest terms, not with the
            # element (over 40 seeds at most 0.22% of the largest gradient; CI saw 0.0625 and 0.25 apart)
            torch.testing.assert_close(gx, wx, atol=1e-2 * float(wx.abs().max()), rtol=5e-2)
        after = torch.randn(3, 3) @ torch.randn(3, 3)  # the caller's code: plain fp32, grad on
        assert after.dtype == torch.float32


def test_a_grad_mode_left_in_a_resumed_frame_is_restored_for_the_caller():
    """The grad mode a graph ends in is set after the graph: the backend's trace consumes the graph's
    own _set_grad_enabled nodes (before: grad stayed off after every call, for the caller's code too)."""
    kiln.reset()
    compiled = kiln.compile(no_grad_only, backend="inductor")
    for _ in range(3):
        x = torch.randn(4, 4, requires_grad=True)
        out, inside = compiled(x)
        assert torch.is_grad_enabled() and inside is True
        assert out.requires_grad
        y = x * 2  # the caller's own code records its graph again
        assert y.requires_grad


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gradient_after_a_resumed_no_grad_block(backend):
    """A graph entered with grad off that turns it on over inputs that require grad (the resumed end of a
    no_grad block) runs in Python, said in explain(): before, its output required grad with no grad_fn."""
    kiln.reset()
    compiled = kiln.compile(no_grad_only, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 4, requires_grad=True)
        gx, = torch.autograd.grad(compiled(x)[0].sum(), x)
        torch.testing.assert_close(gx, torch.ones_like(x))
    ex = kiln.explain(no_grad_only)(torch.randn(4, 4, requires_grad=True))
    assert "enables it" in ex.as_text(), ex.as_text()


def _autocast_nesting() -> int:
    level = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return level - 1


@pytest.mark.parametrize("fn", [inside, returns_inside])
def test_a_break_inside_autocast_leaves_torchs_autocast_nesting_balanced(fn) -> None:
    """The capture exited the block's real autocast state twice (at the break, then in its cleanup):
    torch's nesting count went to -1, so leaving the outermost autocast block never cleared its cast cache
    again, and later autocast code -- eager code too -- multiplied by stale bf16 casts of weights updated
    since (a GradScaler training step diverged from eager's from its second step)."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    linear = torch.nn.Linear(3, 3)
    for step in range(3):
        compiled(torch.randn(4, 3))
        assert _autocast_nesting() == 0
        with torch.no_grad():
            linear.weight.add_(1.0)  # an optimizer step: the next autocast block must cast the new weight
        x = torch.randn(2, 3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = linear(x)
        want = torch.nn.functional.linear(x.bfloat16(), linear.weight.bfloat16(), linear.bias.bfloat16())
        torch.testing.assert_close(got, want, msg=f"step {step}")
