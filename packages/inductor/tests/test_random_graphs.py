"""Hypothesis-driven random graphs of pointwise / reduction / view compositions, compared with eager.

Every example packs CHAINS independent random chains into one graph (one g++ build checks many
cases). Cases per run = examples x CHAINS: KILN_HYPOTHESIS_EXAMPLES=100 gives 2,000 (CI); the local
default of 15 gives 300.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from helpers import check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("KILN_HYPOTHESIS_EXAMPLES", "15"))
CHAINS = 20

UNARY = {
    "sin": torch.sin, "tanh": torch.tanh, "abs": torch.abs, "neg": torch.neg, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "exp_clamped": lambda x: x.clamp(-5, 5).exp(), "sqrt_abs": lambda x: x.abs().sqrt(),
    "square": lambda x: x * x, "gelu": F.gelu,
}
# Note: no floor/round/bf16 round trips here. Deep in a random chain a discontinuous op turns a
# last-bit difference of upstream math (vector erf for gelu) into a whole unit (CI found
# floor(amax(gelu(x))) = -1 vs 0 at 2,000 cases); that is not a miscompile, and the tolerance of this
# comparison cannot tell the two apart. Those ops are checked exactly by the op_db tests instead.
BINARY = {
    "add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum,
    "where": lambda a, b: torch.where(a > b, a, b * 0.5), "div_safe": lambda a, b: a / (b.abs() + 1),
}


def _reduce(kind: str, d: int):
    def f(x: torch.Tensor) -> torch.Tensor:
        if kind == "sum":
            return x - x.sum(d, keepdim=True) * 0.1
        if kind == "amax":
            return x - x.amax(d, keepdim=True)
        if kind == "mean":
            return x * x.mean(d, keepdim=True)
        if kind == "var":
            return x / (x.var(d, keepdim=True) + 1)
        if kind == "softmax":
            return torch.softmax(x, d)
        if kind == "cumsum":
            return x.cumsum(d) * 0.1
        raise AssertionError(kind)
    return f


def _view(kind: str, d: int):
    def f(x: torch.Tensor) -> torch.Tensor:
        n = x.dim()
        if kind == "permute_roundtrip":
            perm = list(range(n))[::-1]
            return (x.permute(perm) * 1.5).permute(perm)
        if kind == "flatten_flip":
            return x.reshape(-1).flip(0).reshape(x.shape)
        if kind == "split_cat":
            k = max(1, x.shape[d] // 2)
            return torch.cat([x.narrow(d, k, x.shape[d] - k), x.narrow(d, 0, k)], d)
        if kind == "slice_pad":
            return F.pad(x.narrow(d, 1, x.shape[d] - 1), [0, 0] * (n - 1 - d) + [0, 1])
        if kind == "expand_row":
            return x + x.select(d, 0).unsqueeze(d)
        if kind == "transpose_add":
            return x + x.transpose(0, n - 1).contiguous().transpose(0, n - 1)
        raise AssertionError(kind)
    return f


REDUCE = ["sum", "amax", "mean", "var", "softmax", "cumsum"]
VIEWS = ["permute_roundtrip", "flatten_flip", "split_cat", "slice_pad", "expand_row", "transpose_add"]


@st.composite
def step(draw, ndim: int):
    kind = draw(st.sampled_from(["unary", "binary", "reduce", "view"]))
    if kind == "unary":
        return ("unary", draw(st.sampled_from(sorted(UNARY))))
    if kind == "binary":
        return ("binary", draw(st.sampled_from(sorted(BINARY))), draw(st.integers(0, 3)))
    d = draw(st.integers(0, ndim - 1))
    if kind == "reduce":
        return ("reduce", draw(st.sampled_from(REDUCE)), d)
    return ("view", draw(st.sampled_from(VIEWS)), d)


@st.composite
def program(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 9), min_size=ndim, max_size=ndim)))
    chains = [draw(st.lists(step(ndim), min_size=1, max_size=6)) for _ in range(CHAINS)]
    transposed = draw(st.booleans())
    return shape, chains, transposed


def run_chain(chain, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    pool = [a, b]
    x = a
    for s in chain:
        if s[0] == "unary":
            x = UNARY[s[1]](x)
        elif s[0] == "binary":
            x = BINARY[s[1]](x, pool[s[2] % len(pool)])
        elif s[0] == "reduce":
            x = _reduce(s[1], s[2])(x)
        else:
            x = _view(s[1], s[2])(x)
        pool.append(x)
    return x


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program())
def test_random_graph_matches_eager(prog) -> None:
    shape, chains, transposed = prog
    torch.manual_seed(0)
    a = torch.randn(shape)
    b = torch.randn(shape[::-1]).permute(*range(len(shape) - 1, -1, -1)) if transposed else torch.randn(shape)

    def f(a, b):
        return tuple(run_chain(c, a, b) for c in chains)
    check(f, a, b, atol=1e-4, rtol=1e-3)
