"""Automatic dynamic shapes meet size 1 and other layouts: every call of a compiled program equals
eager's, whatever sizes (1, 2, 5, 8) and strides its inputs have, and how many graphs it takes.

A graph with symbolic sizes assumes its inputs' stride expressions (``s1`` for a contiguous
``[s0, s1]``) and, for a dim that became dynamic, a size range; a call outside them recompiles.
Each case is called repeatedly with fresh inputs against eager (the default inductor backend).
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import kiln

SIZES = (5, 8, 2, 1, 8, 1, 5, 2)  # the first size compiles static, the second makes the dim dynamic


def _graphs(fn) -> int:
    return kiln.stats().graphs_compiled - fn


def _check(f, make, sizes=SIZES):
    """``f`` compiled, called with ``make(n)`` for each size, equal to eager; the graphs compiled."""
    kiln.reset()
    start = kiln.stats().graphs_compiled
    g = kiln.compile(f)
    for n in sizes:
        args = make(n)
        torch.testing.assert_close(g(*args), f(*args), msg=lambda m, n=n: f"size {n}: {m}")
    return _graphs(start)


def test_broadcast_against_a_size_one_row():
    """x[b, n] + y[1, n]: y broadcasts over b, also when b becomes 1."""
    def f(x, y):
        return x * 2 + y
    graphs = _check(f, lambda b: (torch.randn(b, 6), torch.randn(1, 6)))
    assert graphs <= 3


def test_two_dynamic_operands_one_of_which_becomes_one():
    """x[b, n] + y[b, n], then y[1, n] beside x[b, n]: a broadcast the graph did not trace."""
    def f(x, y):
        return (x + y).sum(0)
    kiln.reset()
    g = kiln.compile(f)
    for b, c in ((5, 5), (8, 8), (2, 2), (1, 1), (8, 1), (5, 5), (1, 5), (2, 2)):
        x, y = torch.randn(b, 6), torch.randn(c, 6)
        torch.testing.assert_close(g(x, y), f(x, y), msg=lambda m, b=b, c=c: f"{(b, c)}: {m}")


def test_size_one_dim_with_any_stride():
    """A [b, 7] slice of a [b, 20] tensor (stride (20, 1)), b down to 1, beside contiguous calls:
    a size-1 dim's stride never matters to eager, and the graph reads only what it guarded."""
    def f(x):
        return x.reshape(-1) * 3 + x.sum(1).repeat_interleave(x.shape[1])
    kiln.reset()
    g = kiln.compile(f)
    for b, sliced in ((5, False), (8, False), (1, True), (5, True), (1, False), (2, True), (1, True)):
        x = torch.randn(b, 20)[:, :7] if sliced else torch.randn(b, 7)
        torch.testing.assert_close(g(x), f(x), msg=lambda m, b=b, s=sliced: f"b={b} sliced={s}: {m}")


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "contiguous"])
def test_dynamic_entry_with_other_strides(layout):
    """A graph made for contiguous inputs of varying size, then called with other layouts: the
    strides are guarded (same sizes, other strides recompile rather than read wrong elements)."""
    def f(x):
        return x * 2 + x.sum(1, keepdim=True)

    def make(b):
        if layout == "transposed":
            return (torch.randn(6, b).t(),)
        if layout == "sliced":
            return (torch.randn(b, 12)[:, ::2],)
        if layout == "expanded":
            return (torch.randn(1, 6).expand(b, 6),)
        return (torch.randn(b, 6),)
    kiln.reset()
    g = kiln.compile(f)
    for b in (3, 4):
        x = torch.randn(b, 6)
        torch.testing.assert_close(g(x), f(x))
    for b in (5, 8, 2, 1, 8, 5):
        (x,) = make(b)
        torch.testing.assert_close(g(x), f(x), msg=lambda m, b=b: f"{layout} b={b}: {m}")


def test_expand_and_reshape_of_a_dynamic_batch():
    def f(x, w):
        h = x.unsqueeze(1).expand(x.shape[0], 3, x.shape[1])
        return (h.reshape(-1, x.shape[1]) @ w).reshape(x.shape[0], 3, -1).mean(1)
    w = torch.randn(6, 4)
    _check(f, lambda b: (torch.randn(b, 6), w))


def test_expand_of_a_size_one_input_to_a_dynamic_batch():
    def f(x, y):
        return y.expand(x.shape[0], -1) * x
    _check(f, lambda b: (torch.randn(b, 6), torch.randn(1, 6)))
    _check(f, lambda b: (torch.randn(b, 6), torch.randn(b, 6)), sizes=(5, 8, 1, 2, 1))


def test_squeeze_of_a_batch_that_becomes_one():
    """squeeze() drops a dim only where it is 1: a graph traced for b >= 2 keeps it, so b == 1
    must not run that graph (torch's size-oblivious tracing would, and return [1, 6] for [6])."""
    def f(x):
        return x.squeeze() * 2
    _check(f, lambda b: (torch.randn(b, 6),))


def test_mlp_over_batches_1_to_20_compiles_at_most_twice():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    kiln.reset()
    start = kiln.stats().graphs_compiled
    g = kiln.compile(m)
    with torch.no_grad():
        for b in range(1, 21):
            x = torch.randn(b, 8)
            torch.testing.assert_close(g(x), m(x))
    assert _graphs(start) <= 2


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 2)).eval()


def _input_shape(g) -> tuple:
    """The shape of the last compiled entry's image input (SymInts where symbolic)."""
    entries = kiln.capture.cache_entries(g._compiled_forward)
    fakes = [n.meta["val"] for n in entries[-1].capture.captured.gm.graph.nodes
             if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
             and n.meta["val"].dim() == 4 and n.meta["val"].shape[1] == 3]
    return tuple(fakes[0].shape)


def test_cnn_at_one_size_stays_static():
    m = _cnn()
    kiln.reset()
    start = kiln.stats().graphs_compiled
    g = kiln.compile(m)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 3, 16, 16)
            torch.testing.assert_close(g(x), m(x))
    assert _graphs(start) == 1
    assert all(type(s) is int for s in _input_shape(g))


def test_cnn_partial_last_batch_keeps_static_height_and_width():
    m = _cnn()
    kiln.reset()
    start = kiln.stats().graphs_compiled
    g = kiln.compile(m)
    with torch.no_grad():
        for b in (8, 8, 8, 3, 8, 5):
            x = torch.randn(b, 3, 16, 16)
            torch.testing.assert_close(g(x), m(x))
    assert _graphs(start) == 2
    shape = _input_shape(g)
    assert isinstance(shape[0], torch.SymInt) and all(type(s) is int for s in shape[1:])


def _llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256, tie_word_embeddings=False,
                                   attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.slow
def test_llama_serving_stream_compiles():
    """40 requests, batch 1-8 x seq 8-64 (batch 1 at requests 21 and 23), nothing marked: the first
    request compiles static, the first change of sequence length makes sequence and batch symbolic,
    and that graph serves every later request, batch 1 included (HF's masking branch on ``batch !=
    1`` only expands position ids of batch 1 to batch 1 there: size_one_branch.py)."""
    model = _llama()
    rng = random.Random(0)
    pairs = [(rng.randint(1, 8), rng.randint(8, 64)) for _ in range(40)]
    kiln.reset()
    start = kiln.stats().graphs_compiled
    step = kiln.compile(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for b, s in pairs:
            ids = torch.randint(0, 256, (b, s), generator=gen)
            torch.testing.assert_close(step(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    assert 1 in {b for b, _ in pairs}
    assert _graphs(start) == 2


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("case", ["slice", "split", "narrow"])
def test_an_expression_of_sizes_that_is_1_at_the_trace_is_guarded(backend, case):
    """``x[4:] * 3`` traced at ``s0 = 5``: the slice's size ``s0 - 4`` is 1 there. torch's broadcast rule
    asked whether it is 1, kiln answered from the example with no guard, and the product came out of
    size 1 for every later size (inductor). The answer is guarded now (the trace is for ``s0 = 5``)."""
    fns = {"slice": lambda x: x[4:] * 3,
           "split": lambda x: torch.split(x, 2)[-1] * len(torch.split(x, 2)),
           "narrow": lambda x: x.narrow(0, 4, x.shape[0] - 4) + 1}
    f = fns[case]
    kiln.reset()
    g = kiln.compile(f, dynamic=True, backend=backend)
    for n in (5, 6, 9, 5, 7, 6):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), f(x), msg=lambda m, n=n: f"size {n}: {m}")
