"""Corpus programs: graph breaks and their resume functions."""

from __future__ import annotations

import collections  # noqa: F401
import dataclasses  # noqa: F401
import functools  # noqa: F401
import math  # noqa: F401
import operator  # noqa: F401
from typing import NamedTuple  # noqa: F401

import torch
import torch.nn.functional as F  # noqa: F401
from torch import nn  # noqa: F401

from .corpus_python import Affine
from .corpus_registry import case, graph_break, one, two  # noqa: F401


# ---- graph breaks --------------------------------------------------------------------------
@case(graphs=1, breaks=0)  # print is replayed after the graph
def break_on_print(x, y):
    a = x + 1
    print("kiln-corpus", a.shape)
    return a * y


@case(graphs=3, breaks=1)  # the Python value differs per call: specialised, recompiled
def break_on_item(x, y):
    s = x.sum().item()
    return y * s


@case(graphs=2, breaks=1, args=lambda: (torch.randn(4, 4).abs(), torch.randn(4, 4)))
def break_data_dependent_if(x, y):
    z = x * 2
    if z.sum() > 0:
        return z + y
    return z - y


@case(graphs=2, breaks=1, args=lambda: (-torch.randn(4, 4).abs(), torch.randn(4, 4)))
def break_data_dependent_else(x, y):
    z = x * 2
    if z.sum() > 0:
        return z + y
    return z - y


def _untraceable(t):
    graph_break("kiln-corpus inner")
    return t * 3


@case(graphs=3, breaks=2)
def break_in_callee(x, y):
    a = x + 1
    b = _untraceable(a)
    return b + y


@case(graphs=3, breaks=2)
def break_in_loop(x, y):
    for i in range(2):
        x = x + i
        graph_break("kiln-corpus loop", i)
    return x * y


@case(graphs=2, breaks=1)
def break_in_no_grad(x, y):
    with torch.no_grad():
        a = x * 2
        graph_break("kiln-corpus with")
        b = a + y
    return b, torch.is_grad_enabled()


@case(graphs=3, breaks=1)  # the Python value differs per call: specialised, recompiled
def break_nested_call_args(x, y):
    return torch.add(x, torch.tensor(float(len(str(x.shape)))) * y.sum().item())


@case(graphs=3, breaks=1)  # the Python value differs per call: specialised, recompiled
def break_tolist(x, y):
    vals = x[0].tolist()
    return y * len(vals)


@case(graphs=2, breaks=1)
def break_keeps_locals(x, y):
    k = 3
    names = ["a", "b"]
    d = {"x": x + 1}
    graph_break("kiln-corpus locals")
    return d["x"] * k + len(names) + y


@case(graphs=1, breaks=1)  # nothing is computed before the break: no graph there
def break_then_loop(x, y):
    graph_break("kiln-corpus before loop")
    for i in range(3):
        x = x + y * i
    return x


@case(graphs=1, breaks=1)
def break_at_start(x, y):
    graph_break("kiln-corpus first")
    return x + y


@case(graphs=3, breaks=2)
def two_breaks(x, y):
    a = x + 1
    graph_break("kiln-corpus one")
    b = a * y
    graph_break("kiln-corpus two")
    return b - 1


@case(graphs=2, breaks=1)
def break_method_call(x, y):
    a = Affine(2)
    z = a.apply(x)
    graph_break("kiln-corpus method")
    return z + a.k + y


@case(graphs=2, breaks=1)
def break_in_try(x, y):
    try:
        z = x + 1
        graph_break("kiln-corpus try")
    except RuntimeError:
        z = x
    return z * y


@case(graphs=2, breaks=1)
def break_with_closure(x, y):
    k = 3

    def scale(t):
        return t * k
    a = scale(x)
    graph_break("kiln-corpus closure")
    return scale(a) + y


@case(graphs=2, breaks=1)
def break_keyword_call(x, y):
    a = x + 1
    graph_break("kiln-corpus", "kw", sep="-")
    return a * y
