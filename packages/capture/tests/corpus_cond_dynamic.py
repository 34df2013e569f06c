"""Corpus programs: torch.cond as a subgraph op, and dynamic shapes (symbolic sizes in Python code)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .corpus_registry import case


def _pos():
    return (torch.randn(4, 4).abs() + 0.1, torch.randn(4, 4))


def _neg():
    return (-torch.randn(4, 4).abs() - 0.1, torch.randn(4, 4))


@case(calls=(_pos, _neg, _pos))  # one graph: the predicate is data, not a guard
def cond_both_branches_one_graph(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: a * b, lambda a, b: a + b, (x, y))


@case(calls=(_pos, _neg))
def cond_multiple_outputs(x, y):
    def t(a, b):
        return a + b, a.sum(0)

    def f(a, b):
        return a - b, b.mean(0)
    s, m = torch.cond(x.mean() > 0, t, f, (x, y))
    return s * 2 + m


@case(calls=(_pos, _neg))
def cond_closure_over_outer_tensor(x, y):
    z = y.relu()
    return torch.cond(x[0, 0] > 0, lambda a: a + z, lambda a: a - z, (x,))


_COND_LIN = nn.Linear(4, 4)


@case(calls=(_pos, _neg))
def cond_branch_calls_module(x, y):
    return torch.cond(x.sum() > 0, lambda a: _COND_LIN(a), lambda a: F.gelu(a), (x,)) + y


@case(calls=(_pos, _neg))
def cond_nested(x, y):
    def outer(a, b):
        return torch.cond(b.sum() > 0, lambda p, q: p * q, lambda p, q: p / (q.abs() + 1), (a, b))
    return torch.cond(x.sum() > 0, outer, lambda a, b: a - b, (x, y))


@case(calls=(_pos, _neg))
def cond_on_python_bool_inlines(x, y):
    flag = x.shape[0] == 4
    return torch.cond(flag, lambda a: a.sin(), lambda a: a.cos(), (x,))


@case(calls=(_pos, _neg))
def cond_result_used_after(x, y):
    r = torch.cond(x.max() > 0.5, lambda a: a.exp(), lambda a: a.tanh(), (x,))
    return (r @ y).softmax(-1)


@case(calls=(_pos, _neg))
def cond_inside_loop(x, y):
    out = x
    for k in range(2):
        out = torch.cond(out.sum() > k, lambda a: a * 0.5, lambda a: a + 1.0, (out,))
    return out + y


@case(calls=(_pos, _neg))
def cond_keyword_operands(x, y):
    return torch.cond(x.sum() > 0, lambda a: a * 3, lambda a: a * -3, operands=(y,))


def _sizes(*ns):
    return tuple((lambda n=n: (torch.randn(n, 4), torch.randn(n, 4))) for n in ns)


@case(graphs=2, calls=_sizes(3, 5, 7, 9))
def dynamic_view_with_symbolic_size(x, y):
    n = x.size(0)
    return (x * y).view(n * 2, 2).sum(1)


@case(graphs=2, calls=_sizes(2, 4, 6))
def dynamic_slice_by_symbolic_half(x, y):
    half = x.shape[0] // 2
    return x[:half].sum(0) + y[half:].sum(0)


@case(graphs=2, calls=_sizes(3, 5, 8))
def dynamic_new_tensor_from_size(x, y):
    return x + torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(1) + torch.zeros(x.shape[0], 1)


@case(graphs=2, calls=_sizes(3, 5, 8))
def dynamic_expand_and_repeat(x, y):
    n = x.shape[0]
    return x.sum(0).expand(n, 4) + y.mean(0).repeat(n, 1)


@case(graphs=2, calls=_sizes(3, 5, 8))
def dynamic_cat_and_split(x, y):
    both = torch.cat([x, y], 0)
    a, b = both.split(x.shape[0], 0)
    return a * b


@case(graphs=2, calls=_sizes(3, 5, 8))
def dynamic_attention_scores(x, y):
    n, d = x.shape
    att = (x @ y.T) / (d ** 0.5)
    return att.softmax(-1) @ y + n


@case(dynamic=True, calls=_sizes(3, 5, 8))
def dynamic_true_from_first_call(x, y):
    return x.reshape(-1, 2).sum(1) + y.flatten()[: x.numel() // 2]


@case(graphs=3, dynamic=False, calls=_sizes(3, 5, 8))
def dynamic_false_specialises_each(x, y):
    return x.sum(0) * x.shape[0]


@case(graphs=2, calls=_sizes(3, 5, 8))
def dynamic_size_in_python_loop_bound(x, y):
    out = y[0]
    for i in range(min(x.shape[0], 2)):
        out = out + x[i]
    return out
