"""Foreach ops whose scalars are a tensor (``_foreach_addcdiv.Tensor``, ``_foreach_addcmul.Tensor``) and
the ScalarList overloads: torch.optim's foreach Adam under a compiler stacks one step size per parameter
and hands the stack to ``_foreach_addcdiv_``. Both are lowered (strict lowering: no ATen fallback), the
stack of more than ``CAT_MAX_CHAIN`` 0-d parts included, and equal eager on fresh inputs."""

from __future__ import annotations

import torch
from helpers import STRICT, assert_close, check, compile_fn
from tracer import flat_outputs

from kiln.inductor.lowering.indexing import CAT_MAX_CHAIN

N = CAT_MAX_CHAIN + 4  # more parts than a where-chain takes: the small-cat path


def _state(seed: int, n: int = N) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3 + 5 * k,) if k % 2 else (2 + k % 3, 4 + k) for k in range(n)]
    ps = [torch.randn(s, generator=g) for s in shapes]
    ms = [torch.randn(s, generator=g) for s in shapes]
    vs = [torch.rand(s, generator=g) + 0.1 for s in shapes]
    steps = [torch.tensor(float(1 + k), dtype=torch.float32) for k in range(n)]
    return ps + ms + vs + steps


def _adam_tail(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The end of torch.optim's foreach Adam as a compiler sees it: step sizes from the step tensors,
    stacked, then one ``_foreach_addcdiv`` over the parameters with the stack as its scalars."""
    n = len(flat) // 4
    p, m, v, steps = (list(flat[k * n:(k + 1) * n]) for k in range(4))
    sizes = torch.stack([-1e-3 / (1 - 0.9 ** s) for s in steps])
    denom = torch._foreach_add(torch._foreach_sqrt(v), 1e-8)
    out = torch._foreach_addcdiv(p, m, denom, sizes)
    out2 = torch._foreach_addcmul(p, m, v, sizes)
    return (*out, *out2)


def test_tensor_scalars_lower_with_the_stack_and_match_eager() -> None:
    cg = check(_adam_tail, *_state(0))
    assert "fallbacks" not in cg.texts
    code = cg.texts["output_code"]
    assert "aten.cat" not in code and "aten._foreach" not in code
    for seed in (1, 2):  # fresh inputs, the same compiled graph
        args = _state(seed)
        got = cg.fn(*args)
        with torch.no_grad():
            want = flat_outputs(_adam_tail(*args))
        for g, w in zip(got, want):
            assert_close(g, w)


def test_the_small_stack_is_stored_once_not_per_part() -> None:
    """The stack of N step sizes is one buffer of N elements, written by one kernel, not N buffers."""
    cg = compile_fn(_adam_tail, *_state(0), options=STRICT)
    code = cg.texts["output_code"]
    assert code.count(f"torch.empty_strided(({N},)") == 1
    assert "torch.empty_strided(((), ())" not in code and "torch.empty_strided((1,)" not in code


def test_scalar_list_overloads() -> None:
    def f(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(flat) // 4
        p, m, v = (list(flat[k * n:(k + 1) * n]) for k in range(3))
        scalars = [0.5 + 0.25 * k for k in range(n)]
        return (*torch._foreach_addcdiv(p, m, torch._foreach_add(v, 1.0), scalars),
                *torch._foreach_addcmul(p, m, v, scalars), *torch._foreach_lerp(p, m, scalars))
    cg = check(f, *_state(3, n=4))
    assert "fallbacks" not in cg.texts
