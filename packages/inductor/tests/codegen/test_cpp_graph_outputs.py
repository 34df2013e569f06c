"""The C++ wrapper's outputs, built and run (compile_graph with ``wrapper="cpp"``; the text is
test_cpp_graph_call.py's): the library allocates each output when its program computes it and hands it
over, so the caller allocates nothing and no output is live before the program makes it. Every aliasing
case comes back as the Python wrapper returns it, for static and symbolic sizes, over fresh inputs."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest
import torch
from dynamic_helpers import symbolic_graph
from torch.profiler import ProfilerActivity, profile
from tracer import trace

from kiln.graph import CompiledGraph
from kiln.inductor import InductorOptions, compile_graph

# slow: each test builds a library against libtorch's headers
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None, reason="the library is built with g++")]


def aliasing(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x @ w
    return (x,  # an input itself
            x.view(-1)[2:7],  # a view of an input
            y, y,  # one tensor returned twice
            y.t(),  # a view of another output
            y.view(-1)[3:],  # a view of another output, at an offset
            (x * 2).sum(0))


def both(fn: Callable[..., Any], *args: torch.Tensor, symbolic: bool) -> tuple[CompiledGraph, CompiledGraph]:
    """``fn`` compiled with the C++ wrapper and with the Python wrapper (``symbolic``: dim 0 of the first
    argument a size symbol)."""
    if symbolic:
        gm, examples = symbolic_graph(fn, *args, dynamic={0: (0,)})
    else:
        gm, examples = trace(fn, *args), list(args)
    cpp = compile_graph(gm, examples, options=InductorOptions(wrapper="cpp"))
    assert "_GraphLibrary(" in cpp.portable.source  # the C++ wrapper ran, not a fallback
    return cpp, compile_graph(gm, examples, options=InductorOptions())


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_aliasing_outputs_match_eager_and_the_python_wrapper(symbolic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    cpp, python = both(aliasing, torch.randn(6, 5), torch.randn(5, 4), symbolic=symbolic)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the caller allocated an output")

    for n in (6, 3, 9, 6) if symbolic else (6, 6, 6):
        x, w = torch.randn(n, 5), torch.randn(5, 4)
        want, reference = aliasing(x, w), python.fn.call_owned([x, w])
        with monkeypatch.context() as m:  # the library allocates every output: Python makes none
            m.setattr(torch, "empty_strided", refuse)
            m.setattr(torch, "empty", refuse)
            got = cpp.fn.call_owned([x, w])
        for g, r, e in zip(got, reference, want, strict=True):
            torch.testing.assert_close(g, e)
            assert (g.shape, g.stride(), g.storage_offset()) == (r.shape, r.stride(), r.storage_offset())
            assert not g.is_inference()  # an ordinary tensor, usable in any mode
        assert got[0] is x and reference[0] is x
        assert got[2] is got[3]  # one tensor twice, as the Python wrapper (and eager) return it
        y = got[2].untyped_storage().data_ptr()
        assert got[4].untyped_storage().data_ptr() == y and got[5].untyped_storage().data_ptr() == y
        assert got[1].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()  # the input's memory: copied
        got[2].add_(1)  # in place, outside any inference mode
        torch.testing.assert_close(got[4], want[4] + 1)


def large_output_last(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w1)  # 64 x 32768 floats (8 MiB), dead after the mean
    return (h.mean(1, keepdim=True) * x) @ w2  # 64 x 32768: the output, computed last


def peak_bytes(fn: Callable[[list[torch.Tensor]], Any], args: list[torch.Tensor]) -> int:
    """The most bytes the CPU allocator held at once during ``fn(args)`` beyond what it held before (every
    allocation, in Python or in the library's C++, as the profiler records it), the result kept."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(list(args))
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = top = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        top = max(top, now)
    del out
    return top


def test_an_output_computed_last_is_not_held_through_the_call() -> None:
    """The large output is allocated when the program computes it, after the large intermediate died
    (the memory plan may even reuse it): the call's peak is one large tensor, as the Python wrapper's, not
    two (as when the caller allocated the output before the call)."""
    args = [torch.randn(64, 64), torch.randn(64, 32768), torch.randn(64, 32768)]
    cpp, python = both(large_output_last, *args, symbolic=False)
    large = 64 * 32768 * 4
    for _ in range(3):
        args = [torch.randn(64, 64), torch.randn(64, 32768), torch.randn(64, 32768)]
        (got,) = cpp.fn.call_owned(list(args))
        want = large_output_last(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
        peak, reference = peak_bytes(cpp.fn.call_owned, args), peak_bytes(python.fn.call_owned, args)
        assert large <= peak < 1.5 * large, (peak, large)
        assert peak <= reference + 64 * 1024, (peak, reference)


def layers(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(12):  # attention-like layers; each one's residual add is written over a matmul's result
        s = torch.softmax((x @ w) @ x.t() * 0.05, -1)
        x = torch.tanh(s @ x + x)
    return x


def test_buffers_taken_over_are_freed_as_in_the_python_wrapper() -> None:
    """A buffer the memory plan places over a dead one's memory (a kernel's output written over its input)
    holds that memory under a second handle: the dead one's handle is dropped after the step, so the memory
    dies with the new buffer, as in the Python wrapper, and is not held until the call returns (one
    activation per layer: a 12-layer GPT-2's peak grew by several activations)."""
    n, d = 512, 64
    cpp, python = both(layers, torch.randn(n, d), torch.randn(d, d), symbolic=False)
    for _ in range(3):
        args = [torch.randn(n, d), torch.randn(d, d) * 0.1]
        (got,) = cpp.fn.call_owned(list(args))
        torch.testing.assert_close(got, layers(*args), rtol=1e-4, atol=1e-4)
        peak, reference = peak_bytes(cpp.fn.call_owned, args), peak_bytes(python.fn.call_owned, args)
        assert n * n * 4 <= peak <= reference + 64 * 1024, (peak, reference)
