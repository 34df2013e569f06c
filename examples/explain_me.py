"""A function with a graph break, for ``kiln explain examples/explain_me.py:f --shape 4,8``."""

import torch


def f(x):
    y = torch.relu(x) * 2
    if y.sum() > 0:  # data-dependent control flow: a graph break
        return y + 1
    return y - 1


def f_inputs():
    return (torch.randn(4, 8),)
