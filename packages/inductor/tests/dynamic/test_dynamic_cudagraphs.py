"""reduce-overhead with symbolic sizes: one compiled graph, CUDA graphs recorded per distinct size (with
the recording cap and a log line each), and opt-in size buckets (``cudagraph_sizes``) that pad the
leading dim and slice the outputs. CPU tests run the trees on the emulated engine; GPU tests are marked."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import CPP, compile_symbolic

from kiln.inductor.cudagraphs import (
    CUDAGraphOptions,
    CUDAGraphTree,
    EmulatedGraphEngine,
    wrap_reduce_overhead,
)
from kiln.inductor.size_buckets import BucketedCall, plan_buckets

torch.manual_seed(0)
W1, B1, W2 = torch.randn(16, 8) * 0.3, torch.randn(16), torch.randn(4, 16) * 0.3


def mlp(x, w1, b1, w2):
    return (F.linear(F.gelu(F.linear(x, w1, b1)), w2).softmax(-1),)


def _compiled(fn, example, options=CPP, **kw):
    return compile_symbolic(fn, example, W1, B1, W2, options=options.replace(**kw), dynamic={0: (0,)})


class _Sizes:
    """The compiled function, noting the leading size of every call it gets."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def __call__(self, *args):
        self.seen.append(args[0].shape[0])
        return self.fn(*args)


def test_buckets_pad_and_slice_one_compile_all_sizes():
    cg = _compiled(mlp, torch.randn(37, 8), cudagraph_sizes=[1, 2, 4, 8, 16])
    assert isinstance(cg.fn, BucketedCall)
    inner = _Sizes(cg.fn.fn)
    cg.fn.fn = inner
    for n in (3, 1, 5, 16, 7, 2, 9, 20, 0):
        x = torch.randn(n, 8)
        (got,) = cg.fn(x, W1, B1, W2)
        torch.testing.assert_close(got, mlp(x, W1, B1, W2)[0])
    assert inner.seen == [4, 1, 8, 16, 8, 2, 16, 20, 1]  # 20: above the largest bucket, as it is


@pytest.mark.parametrize("fn, why", [
    (lambda x, w1, b1, w2: (F.linear(x, w1, b1).softmax(0),), "reduces over"),
    (lambda x, w1, b1, w2: (F.linear(x.flip(0), w1, b1),), "another row"),
    (lambda x, w1, b1, w2: (F.linear(x, w1, b1).sum(0) @ w2.t(),), "reduces over"),
])
def test_buckets_refused_when_rows_meet(fn, why, caplog):
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        cg = _compiled(fn, torch.randn(37, 8), cudagraph_sizes=[4, 8])
    assert not isinstance(cg.fn, BucketedCall)
    _, reason = plan_buckets(cg.loop_program, [4, 8])  # type: ignore[attr-defined]
    assert why in reason, reason
    assert "cudagraph_sizes not applied" in caplog.text
    for n in (3, 5, 1):  # still correct, unpadded
        x = torch.randn(n, 8)
        torch.testing.assert_close(cg.fn(x, W1, B1, W2)[0], fn(x, W1, B1, W2)[0], atol=1e-4, rtol=1e-4)


def _graphed(cg, max_recordings=8):
    """As the inductor backend applies reduce-overhead (wrap_reduce_overhead); returns the caller's
    function and the CUDAGraphFunction that records (inside the buckets' padding when there are any)."""
    tree = CUDAGraphTree("cpu", engine=EmulatedGraphEngine(), name="dyn")
    f = wrap_reduce_overhead(cg.fn, [torch.randn(4, 8), W1, B1, W2], (1, 2, 3), tree=tree,
                             options=CUDAGraphOptions(max_recordings=max_recordings))
    return f, (f.fn if isinstance(f, BucketedCall) else f)


def test_graphs_recorded_per_size_with_cap_and_log(caplog):
    cg = _compiled(mlp, torch.randn(37, 8))
    f, graphs = _graphed(cg, max_recordings=3)
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for n in (2, 2, 2, 3, 3, 3, 5, 5, 5, 7, 7, 2):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x, W1, B1, W2)[0], mlp(x, W1, B1, W2)[0])
    assert graphs.stats.recordings == 3 and len(graphs.tree.nodes) == 3  # 2, 3, 5; 7 is over the cap
    assert caplog.text.count("recorded for input sizes") == 3
    assert "the limit" in caplog.text


def test_buckets_bound_the_recordings():
    cg = _compiled(mlp, torch.randn(37, 8), cudagraph_sizes=[4, 8, 16])
    f, graphs = _graphed(cg)
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 3, 6, 12):
        for _ in range(2):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x, W1, B1, W2)[0], mlp(x, W1, B1, W2)[0])
    assert graphs.stats.recordings == 3  # one graph per bucket


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_reduce_overhead_per_size_and_buckets():
    dev = "cuda"
    w1, b1, w2 = W1.to(dev), B1.to(dev), W2.to(dev)
    for sizes, expect in (((), 5), ((8, 16, 32), 3)):
        cg = compile_symbolic(mlp, torch.randn(37, 8, device=dev), w1, b1, w2, dynamic={0: (0,)},
                              options=CPP.replace(cudagraph_sizes=sizes))
        f = wrap_reduce_overhead(cg.fn, [torch.randn(4, 8, device=dev), w1, b1, w2], (1, 2, 3))
        for n in (3, 5, 9, 12, 17, 3, 9, 17):
            for _ in range(2):
                x = torch.randn(n, 8, device=dev)
                torch.testing.assert_close(f(x, w1, b1, w2)[0], mlp(x, w1, b1, w2)[0], atol=1e-4, rtol=1e-4)
        graphs = f.fn if isinstance(f, BucketedCall) else f
        assert graphs.stats.recordings == expect
