"""What the C++ wrapper tests share (test_cpp_wrapper.py, test_cpp_wrapper_training.py, test_tiered_wrapper.py):
the options asking for it, which wrapper each compiled graph got, a small transformer block, a call's peak CPU
memory, a training step compared with eager's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kiln.graph import EVENTS, GraphCompiled

CPP = {"wrapper": "cpp"}


class Wrappers:
    """Which wrapper each graph compiled in the block got: True for the C++ one."""

    def __init__(self) -> None:
        self.graphs: list[bool] = []
        self.sources: list[str] = []

    def __call__(self, event: object) -> None:
        if isinstance(event, GraphCompiled):
            portable = getattr(event.compiled, "portable", None)
            self.graphs.append(portable is not None and "_GraphLibrary(" in portable.source)
            self.sources.append(portable.source if portable is not None else "")

    def __enter__(self) -> Wrappers:
        EVENTS.subscribe(self)
        return self

    def __exit__(self, *exc: object) -> None:
        EVENTS.unsubscribe(self)


class Block(nn.Module):
    """A small pre-norm transformer block: layer norm, causal attention (SDPA), GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def _call_peak(fn: Any, *args: torch.Tensor) -> tuple[int, Any]:
    """The most bytes the CPU allocator held at once during ``fn(*args)`` beyond what it held before (every
    allocation, in Python or in the library's C++, as the profiler records it), and the result."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*args)
    now = top = 0
    for e in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns()):
        now += e.nbytes()
        top = max(top, now)
    return top, out


def step_as_eager(eager: nn.Module, model: nn.Module, compiled: Any, x: torch.Tensor, step: int) -> None:
    """One training step of ``eager`` and of ``compiled`` (over ``model``, eager's copy) on ``x``: outputs,
    then the gradients of the sum of squares (accumulated over the steps) equal eager's."""
    got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want, msg=f"step {step}: output")
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=f"step {step}: {name}")
