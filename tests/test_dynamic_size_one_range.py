"""A dim made symbolic (automatically, by ``mark_dynamic`` or ``dynamic=True``) at a size >= 2 has the
range [1, inf): a later call with size 1 runs the same graph unless the trace decided something on
the size being 1, which is then a guard that the call fails (and compiles its own graph).

Each case compiles at 2+ first, then calls with 1 among other sizes, fresh inputs every call,
compared with eager; the graph counts say whether size 1 shared the symbolic graph
(``kiln.stats_reset()`` first: the counters are process-wide). Size 0 stays outside the range.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln


def _run(f, make, sizes) -> int:
    """``f`` compiled and called with ``make(n)`` for each size, equal to eager (inputs and outputs: each
    runs on its own copy of the inputs); the graphs compiled."""
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f)
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            out, ref = (g(*args), *args), (f(*copies), *copies)
            torch.testing.assert_close(out, ref, msg=lambda m, n=n: f"size {n}: {m}")
    return kiln.stats().graphs_compiled


def _guards_of_last_entry(g) -> str:
    entries = kiln.capture.cache_entries(g._optimized)
    return entries[-1].guards.as_text()


class _Block(nn.Module):
    """A Llama-style decoder: RMSNorm, rotary attention (SDPA, causal), SiLU-gated MLP, LM head."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.emb = nn.Embedding(vocab, dim)
        self.n1, self.n2 = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        self.qkv, self.o = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.up, self.gate, self.down = nn.Linear(dim, 64, bias=False), nn.Linear(dim, 64, bias=False), \
            nn.Linear(64, dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)

    @staticmethod
    def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def _rotary(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[2]
        pos = torch.arange(s, dtype=torch.float32)[None, :, None]  # [1, s, 1]: broadcast over the batch
        freqs = pos / (10000 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]  # [1, 1, s, hd/2]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        h = self.emb(ids)
        q, k, v = self.qkv(self._norm(h, self.n1)).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(self._rotary(q), self._rotary(k), v, is_causal=True)
        h = h + self.o(a.transpose(1, 2).reshape(b, s, -1))
        x = self._norm(h, self.n2)
        h = h + self.down(F.silu(self.gate(x)) * self.up(x))
        return self.head(h)


STREAM = [(3, 12), (5, 20), (1, 9), (7, 31), (1, 17), (2, 8), (8, 40), (1, 12), (4, 25)]


@pytest.mark.slow
def test_llama_block_stream_with_batch_one_compiles_twice():
    """Batch and sequence change together: one static graph, then one symbolic graph serves every
    later request, batch 1 included (before: a third graph for batch 1)."""
    torch.manual_seed(0)
    model = _Block().eval()
    gen = torch.Generator().manual_seed(1)
    graphs = _run(model, lambda bs: (torch.randint(0, 64, bs, generator=gen),), STREAM)
    assert graphs == 2


def test_mlp_with_batch_one_after_a_symbolic_graph_compiles_twice():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8), nn.LayerNorm(8)).eval()
    graphs = _run(m, lambda b: (torch.randn(b, 16),), (3, 5, 1, 7, 1, 2, 1, 6))
    assert graphs == 2


def test_batch_zero_stays_outside_the_range():
    """Size 0 is not in [1, inf): it compiles a graph of its own, equal to eager."""
    m = nn.Linear(4, 3)
    graphs = _run(m, lambda b: (torch.randn(b, 4),), (3, 5, 1, 0, 2, 0))
    assert graphs == 3


def test_symbolic_range_includes_one_and_size_one_hits_the_entry():
    def f(x):
        return torch.relu(x) + x.mean(0)
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f)
    for b in (3, 5):
        g(torch.randn(b, 6))
    text = _guards_of_last_entry(g)
    assert re.search(r"SHAPE_EXPR +s\d+ >= 1  # size range", text), text
    assert "!= 1" not in text, text
    x = torch.randn(1, 6)
    torch.testing.assert_close(g(x), f(x))
    assert kiln.stats().graphs_compiled == 2


# ---- programs that really depend on a size being 1: the guard fails, the call recompiles ----------

def _one_after_symbolic(f, make, sizes=(3, 5, 1, 4, 1, 2)) -> int:
    return _run(f, make, sizes)


def test_squeeze_of_dim_zero_recompiles_for_one():
    def f(x):
        return x.squeeze(0) * 2
    assert _one_after_symbolic(f, lambda b: (torch.randn(b, 6),)) == 3


def test_squeeze_all_recompiles_for_one():
    def f(x):
        return x.squeeze() + 1
    assert _one_after_symbolic(f, lambda b: (torch.randn(b, 6),)) == 3


def test_python_branch_on_size_one_recompiles():
    def f(x):
        if x.shape[0] == 1:
            return x * 2
        return x * 3
    assert _one_after_symbolic(f, lambda b: (torch.randn(b, 6),)) == 3


def test_broadcast_of_two_symbolic_dims_where_one_becomes_one():
    """x[b, n] + y[c, n] traced with b == c: a call with c == 1 broadcasts, another graph."""
    def f(x, y):
        return (x + y) * 2
    sizes = ((3, 3), (5, 5), (4, 1), (1, 4), (1, 1), (6, 6), (2, 1))
    graphs = _run(f, lambda bc: (torch.randn(bc[0], 6), torch.randn(bc[1], 6)), sizes)
    assert graphs >= 3  # (4, 1) and (1, 4) are broadcasts the symbolic graph did not trace


def test_expand_of_a_symbolic_dim_that_becomes_one():
    """x[b, 1, n].expand(b, 3, n) and y[c, n].expand(3, c, n): fine for 1 as for any size."""
    def f(x, y):
        return x.expand(-1, 3, -1).sum(1) + y.expand(3, -1, -1).mean(0)
    graphs = _run(f, lambda b: (torch.randn(b, 1, 6), torch.randn(b, 6)), (3, 5, 1, 4, 1))
    assert graphs == 2


def test_expand_of_a_dim_traced_at_one_to_a_symbolic_size():
    def f(x, y):
        return y.expand(x.shape[0], -1) * x
    graphs = _run(f, lambda b: (torch.randn(b, 6), torch.randn(1, 6)), (3, 5, 1, 4, 1))
    assert graphs == 2


def test_view_flat_of_a_size_one_strided_input():
    """x.view(-1) of [b, 7]; a [1, 7] input with the stride (20, 1) of a slice is a layout a size-1
    dim allows eager to view; the graph guarded stride 7, so that call recompiles, equal to eager."""
    def f(x):
        return x.view(-1) * 3
    make = {False: lambda b: torch.randn(b, 7), True: lambda b: torch.randn(b, 20)[:, :7]}
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f)
    for b, sliced in ((3, False), (5, False), (1, False), (1, True), (4, False), (1, True), (1, False)):
        x = make[sliced](b)
        torch.testing.assert_close(g(x), f(x), msg=lambda m, b=b, s=sliced: f"b={b} sliced={s}: {m}")
    assert kiln.stats().graphs_compiled == 3  # static 3, symbolic (b=1 contiguous too), b=1 sliced


def test_one_row_input_with_row_stride_hits_the_symbolic_graph():
    """A [1, s] input with strides (s, 1) has the layout of every [b, s] one: the same graph."""
    def f(x):
        return (x * x).sum(-1)
    graphs = _run(f, lambda bs: (torch.randn(*bs),), ((3, 10), (5, 12), (1, 12), (1, 30), (4, 7)))
    assert graphs == 2


def test_reduction_over_a_dim_that_becomes_one():
    def f(x):
        return x.sum(0), x.amax(0, keepdim=True) - x, x.softmax(0)
    assert _one_after_symbolic(f, lambda b: (torch.randn(b, 6),)) == 2


def test_contiguous_after_transpose_of_a_dynamic_batch_is_equal_to_eager():
    """``.contiguous()`` returns its input or a copy depending on sizes: whatever the trace asked
    about the batch being 1 is guarded, so every call matches eager (values and aliasing)."""
    def f(x):
        y = x.transpose(0, 1).contiguous()
        y.add_(1)
        return x * 2, y
    _run(f, lambda b: (torch.randn(b, 1, 6),), (3, 5, 1, 4, 1))


# ---- how the range meets mark_dynamic and dynamic=True -------------------------------------------

def test_mark_dynamic_min_two_keeps_one_out():
    def f(x):
        return x * 2
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f)
    x = torch.randn(4, 3)
    kiln.mark_dynamic(x, 0, min=2)
    g(x)
    text = _guards_of_last_entry(g)
    assert re.search(r"SHAPE_EXPR +s\d+ >= 2  # size range", text), text
    for b in (5, 1, 3):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert kiln.stats().graphs_compiled == 2  # size 1 is outside [2, inf)


def test_mark_dynamic_without_min_serves_one():
    def f(x):
        return torch.tanh(x) + 1
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f)
    x = torch.randn(4, 3)
    kiln.mark_dynamic(x, 0)
    g(x)
    for b in (5, 1, 3, 1):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert kiln.stats().graphs_compiled == 1


@pytest.mark.parametrize("first", [4, 1])
def test_dynamic_true_serves_one_after_a_larger_size(first):
    """dynamic=True: a size seen as 1 at the first call specialises (as in torch), one seen at 4
    gets the range [1, inf) and serves later 1s."""
    def f(x):
        return x.relu() * 2
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(f, dynamic=True)
    for b in (first, 3, 1, 6, 1):
        x = torch.randn(b, 5)
        torch.testing.assert_close(g(x), f(x))
    assert kiln.stats().graphs_compiled == (1 if first == 4 else 2)


# ---- reshapes and layouts asked from C++ or a backend's re-trace -----------------------------------

def test_reshape_of_attention_output_serves_batch_one():
    """HF's attention: SDPA's output reshaped to its own shape (a view at every batch), then
    transposed and made contiguous; ATen's reshape asks ``batch != 1`` from C++ (and again when the
    backend traces the graph), answered without a guard because the result is a view."""
    def f(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.reshape(a.shape[0], -1, q.shape[2], v.shape[-1])
        return a.transpose(1, 2).contiguous().reshape(q.shape[0], q.shape[2], -1)
    gen = torch.Generator().manual_seed(0)

    def make(bs):
        return tuple(torch.randn(bs[0], 2, bs[1], 8, generator=gen) for _ in range(3))
    graphs = _run(f, make, ((3, 12), (5, 20), (1, 9), (7, 31), (1, 17), (2, 8)))
    assert graphs == 2


def test_linear_over_a_batch_of_fixed_length_rows_serves_batch_one():
    """``nn.Linear`` on [b, 7, 16]: ATen's linear asks from C++ whether the input is contiguous (skipping
    a size-1 dim) to fold the batch into one addmm; the input is contiguous for every b, so the
    answer is the same at 1 and needs no guard."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).eval()
    gen = torch.Generator().manual_seed(1)
    assert _run(m, lambda b: (torch.randn(b, 7, 16, generator=gen),), (4, 6, 1, 3, 1)) == 2


def test_linear_over_a_transposed_input_is_equal_to_eager_at_batch_one():
    """A transposed input is contiguous only when the batch is 1 (then ATen's linear takes its addmm
    path): that question stays a guard, and every call equals eager."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)

    def f(x):
        return lin(x.transpose(0, 1)) * 2
    gen = torch.Generator().manual_seed(1)
    _run(f, lambda b: (torch.randn(7, b, 16, generator=gen),), (4, 6, 1, 3, 1))


@pytest.mark.parametrize("layers", ["mlp", "llama"])
def test_training_serves_batch_one(layers):
    """Training over a dynamic batch: the autograd engine asks, between backward nodes, whether each
    gradient's expected size is 1 (to sum a broadcast gradient down to it). Every gradient the joint
    trace sees has its expected size, so batch 1 runs the symbolic training graph; outputs, the
    input's gradient and every parameter's gradient equal eager's, fresh inputs every call."""
    torch.manual_seed(0)
    if layers == "mlp":
        ref = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    else:
        ref = _Block(dim=16)
    model = copy.deepcopy(ref)
    kiln.reset()
    kiln.stats_reset()
    g = kiln.compile(model)
    gen = torch.Generator().manual_seed(1)
    for b in (4, 6, 1, 3, 1):
        if layers == "mlp":
            x = torch.randn(b, 7, 16, generator=gen, requires_grad=True)
        else:
            x = torch.randint(0, 64, (b, 9), generator=gen)
        x_ref = x.detach().clone().requires_grad_(x.requires_grad)
        out, out_ref = g(x), ref(x_ref)
        torch.testing.assert_close(out, out_ref, msg=lambda m, b=b: f"batch {b}: {m}")
        w = torch.randn(out.shape, generator=gen)
        (out * w).sum().backward()
        (out_ref * w).sum().backward()
        if x.requires_grad:
            torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4, msg=lambda m, b=b: f"batch {b}, input grad: {m}")
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, b=b, n=name: f"batch {b}, grad of {n}: {m}")
            p.grad, p_ref.grad = None, None
    assert kiln.stats().graphs_compiled == 2


def test_reshape_that_copies_keeps_eager_aliasing_at_batch_one():
    """``x.t().reshape(-1)`` of [b, 3] copies for b >= 2 but is a view of x for b == 1, where the
    in-place add then writes into x: the batch-1 question stays a guard and batch 1 compiles its own
    graph, equal to eager (inputs compared too)."""
    def f(x):
        y = x.t().reshape(-1)
        y.add_(1)
        return y * 2
    graphs = _run(f, lambda b: (torch.randn(b, 3),), (3, 5, 1, 4, 1))
    assert graphs == 3


def test_packed_sequence_mask_serves_length_one():
    """HF's packed-sequence mask over expanded position ids (stride 0 on the batch):
    ``(diff(p) != 1).cumsum(-1)`` converts a bool [b, s] to int64, whose layout asks whether the
    length is 1 only to order strides; a later length 1 runs the symbolic graph."""
    def f(x):
        p = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
        d = torch.diff(p, prepend=p[:, :1] - 1, dim=-1)
        return (d != 1).cumsum(-1) + x
    gen = torch.Generator().manual_seed(0)
    graphs = _run(f, lambda bs: (torch.randint(0, 3, bs, generator=gen),),
                  ((3, 12), (5, 20), (4, 1), (7, 31), (2, 1)))
    assert graphs == 2


# ---- a Python branch on a size being 1 whose arm is neutral at 1 (size_one_branch.py) ------------

def test_branch_expanding_position_ids_serves_batch_one():
    """HF's masking code: ``if batch != pos.shape[0]: pos = pos.expand(batch, -1)`` with position
    ids of batch 1; at batch 1 the arm expands [1, n] to [1, n], so one symbolic graph serves it."""
    def f(x):
        pos = torch.arange(x.shape[1])[None]
        if x.shape[0] != pos.shape[0]:
            pos = pos.expand(x.shape[0], -1)
        return (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1) + x * pos
    gen = torch.Generator().manual_seed(0)
    graphs = _run(f, lambda bs: (torch.randint(0, 5, bs, generator=gen),),
                  ((3, 12), (5, 20), (1, 9), (7, 31), (1, 17), (2, 8)))
    assert graphs == 2


def _helper(t):
    return t.view(t.shape)


def _arm_compute(x, y):
    pos = y
    if x.shape[0] != 1:
        pos = pos * 2
    return x + pos


def _arm_append(x, y):
    seen = []
    if x.shape[0] != 1:
        seen.append(1)
    return x + y + len(seen)


def _arm_other_shape(x, y):
    z = y
    if x.shape[0] != 1:
        z = x.reshape(x.shape[0], -1)
    return x + y + z.sum()


def _arm_from_none(x, y):
    w = None
    if x.shape[0] != 1:
        w = y.expand(x.shape[0], -1)
    return x + y + (w is not None)


def _arm_call(x, y):
    pos = y
    if x.shape[0] != 1:
        pos = _helper(pos)
    return x + pos * (pos is y)


@pytest.mark.parametrize("f", [_arm_compute, _arm_append, _arm_other_shape, _arm_from_none, _arm_call],
                         ids=lambda f: f.__name__)
def test_branch_on_batch_one_whose_arm_is_not_neutral_recompiles(f):
    """Arms that change something at batch 1 keep the guard: batch 1 compiles its own graph, and
    every call equals eager (a value computed, a list appended to, a view of another shape, a name
    bound to a tensor only in the arm, a function called)."""
    gen = torch.Generator().manual_seed(0)

    def make(b):
        return torch.randn(b, 6, generator=gen), torch.randn(1, 6, generator=gen)
    assert _run(f, make, (3, 5, 1, 4, 1)) == 3
