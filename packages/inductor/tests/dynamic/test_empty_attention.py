"""Attention over an empty query or key sequence in graphs compiled over symbolic sizes.

ATen's CPU flash attention kills the process (SIGFPE) on a sequence length of 0, which eager never
calls it with; a symbolic graph calls the kernel it traced at every size, so the wrappers branch around
it (kiln.inductor.codegen.empty_attention). Each case runs in a child process: a regression fails the
test instead of killing pytest. Fresh inputs every call, compared with eager.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

D, H = 16, 2
W = torch.randn(3 * D, D, generator=torch.Generator().manual_seed(0)) * 0.2
SIZES = ((3, 5), (1, 0), (2, 1), (1, 5), (3, 0), (1, 7), (0, 4))  # (batch, sequence) per call


def block(x, wqkv, m):
    bsz, t, _ = x.shape
    q, k, v = F.linear(x, wqkv).split(D, -1)
    q, k, v = (z.view(bsz, t, H, D // H).transpose(1, 2) for z in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=m[:t, :t])
    return ((a + b).transpose(1, 2).reshape(bsz, t, D),)


def block_grad(x, wqkv, m):
    """Forward and backward as one graph: the backward kernel sees the empty sequence too."""
    x, wqkv = x.detach().requires_grad_(), wqkv.detach().requires_grad_()
    out, = block(x, wqkv, m)
    return torch.autograd.grad((out * out).sum(), (x, wqkv))


def cross(q, k, v):
    """Queries and keys of independent lengths: an empty key sequence with queries left."""
    return (F.scaled_dot_product_attention(q, k, v),)


def _options(wrapper):
    from dynamic_helpers import CPP
    return CPP.replace(wrapper=wrapper)


def _check(fn, make_args, sizes, wrapper, dynamic):
    from dynamic_helpers import check_sizes, symbolic_graph

    from kiln.inductor import compile_graph

    gm, examples = symbolic_graph(fn, *make_args(*sizes[0]), dynamic=dynamic)
    assert any("flash_attention_for_cpu" in str(n.target) for n in gm.graph.nodes), gm.graph
    cg = compile_graph(gm, examples, options=_options(wrapper))
    assert cg.backend.startswith("inductor"), cg.texts.get("fallbacks")
    for s in sizes:
        check_sizes(cg, fn, lambda _, s=s: make_args(*s), (s,), atol=1e-4)
    return cg


def _block_args(b, t):
    return torch.randn(b, t, D), W, torch.randn(8, 8)


def _cross_args(lq, lk):
    return torch.randn(2, H, lq, 8), torch.randn(2, H, lk, 8), torch.randn(2, H, lk, 8)


def case_block(wrapper):
    cg = _check(block, _block_args, SIZES, wrapper, {0: (0, 1)})
    text = cg.texts.get("cpp_wrapper") or cg.texts["output_code"]
    assert "the kernel is not called" in text


def case_block_grad(wrapper):
    _check(block_grad, _block_args, SIZES, wrapper, {0: (0, 1)})


def case_cross(wrapper):
    _check(cross, _cross_args, ((3, 5), (4, 0), (0, 3), (2, 2), (0, 0), (5, 1)), wrapper, {0: (2,), 1: (2,), 2: (2,)})


def case_static_empty(wrapper):
    """Sizes known to be 0 when compiled: only the outputs are made."""
    from dynamic_helpers import flat
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.inductor import compile_graph

    def f(q, k, v):
        return (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)[0] * 2,)
    for lq, lk in ((0, 4), (4, 0)):
        args = _cross_args(lq, lk)
        gm = make_fx(f, tracing_mode="fake")(*args)
        cg = compile_graph(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"],
                           options=_options(wrapper))
        for _ in range(2):
            args = _cross_args(lq, lk)
            got, = cg.fn(*args)
            want, = flat(cross(*args))
            torch.testing.assert_close(got, want * 2)


CASES = (case_block, case_block_grad, case_cross, case_static_empty)


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["python", "cpp"])
def test_empty_sequences_in_a_child_process(wrapper):
    tests = Path(__file__).parents[1]
    r = subprocess.run([sys.executable, __file__, wrapper], capture_output=True, text=True, cwd=tests, timeout=900)
    assert r.returncode == 0, f"exit status {r.returncode} (-8: SIGFPE)\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))
    for case in CASES:
        print(case.__name__, flush=True)
        case(sys.argv[1])
