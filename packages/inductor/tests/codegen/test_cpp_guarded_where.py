"""``where`` branches that load memory (padding, cat): small ones are computed eagerly with guarded loads
(``cond ? idx : 0``) so the loop stays branch-free; others stay lazy. Results against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import check


def _kernel_source(cg) -> str:
    return cg.texts["output_code"].split("# ---- kernels")[1]


def test_bn_relu_max_pool_with_padding_uses_guarded_loads() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 12)
    x[0, 1, 0, 0] = float("nan")  # a NaN on the padded border wins its windows, as in ATen
    x[1, 2, 11, 11] = float("-inf")
    mean, var, w, b = torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4)

    def f(x, mean, var, w, b):
        y = F.batch_norm(x, mean, var, w, b, training=False).relu()
        return F.max_pool2d(y, 3, 2, 1)
    cg = check(f, x, mean, var, w, b)
    src = _kernel_source(cg)
    assert " : 0)]" in src  # a padded tap reads index 0 where it is masked out
    assert "? kiln_relu" not in src  # no lazily evaluated BN+ReLU branch per tap


def test_cat_and_pad_with_guarded_loads_match_eager() -> None:
    a, b = torch.randn(3, 5), torch.randn(3, 7)
    check(lambda a, b: torch.cat([a.exp(), b * 2], 1) + 1, a, b)
    check(lambda a: F.pad(a.sin(), (2, 3, 1, 0), value=-1.5), a)


def test_integer_division_in_a_branch_is_not_evaluated_where_masked() -> None:
    # eager evaluation would divide by the zeros the condition excludes (SIGFPE for integers)
    n, d = torch.randint(-50, 50, (64,)), torch.randint(-3, 4, (64,))
    d[::3] = 0
    cg = check(lambda n, d: torch.where(d != 0, torch.div(n, torch.where(d != 0, d, 1), rounding_mode="floor"), 0) +
               torch.where(d != 0, n.roll(1) // torch.where(d == 0, 1, d), n), n, d)
    assert cg is not None
