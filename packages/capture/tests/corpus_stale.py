"""Corpus programs: values read from outside whose state only Python sees (numpy arrays, sets,
deques, C objects, objects built at capture time). Each must be recomputed on every call, never
baked into a cache entry (the fresh-input tests call each program three times)."""

from __future__ import annotations

import array
import collections
import random

import numpy as np
import torch

from .corpus_registry import case, graph_break


def _np_arg():
    return (torch.randn(3, 4).numpy(),)


def _x_and_np():
    return (torch.randn(3, 4), torch.randn(3, 4).numpy())


# ---- numpy values out of tensors and back (traced as tensor code: numpy_trace.py) ---------------
@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_copy(x):
    return x.numpy().copy()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_transpose(x):
    return x.numpy().transpose()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_reshape(x):
    return x.numpy().reshape(-1)


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_sum_from_numpy(x):
    return torch.from_numpy(np.sum(x.numpy(), axis=0))


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_scalar_method(x):
    return x.numpy().sum()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(3, 4),))
def stale_numpy_scalar_times_tensor(x):
    s = x.numpy().max()
    return x * 2 + 1, s


@case(graphs=1, breaks=0, args=_x_and_np)
def stale_numpy_arg_method(x, a):
    return x + 1, a.mean()


@case(graphs=1, breaks=0, args=_x_and_np)
def stale_numpy_arg_shape(x, a):
    return x * a.shape[0] + a.ndim


@case(graphs=1, breaks=0, args=_x_and_np)
def stale_numpy_arg_element(x, a):
    return x * a[0, 0]


@case(graphs=1, breaks=0, args=_np_arg)
def stale_numpy_arg_slice(a):
    return a[:, 1:]


@case(graphs=2, breaks=1, args=_x_and_np)
def stale_numpy_arg_truth(x, a):
    if (a > 0).any():
        return x + 1
    return x - 1


# ---- C containers and objects read from the frame ---------------------------------------------------
def _x_and_set():
    return (torch.randn(4), set(torch.randint(0, 6, (3,)).tolist()))


@case(graphs=2, breaks=0, args=_x_and_set)
def stale_set_len(x, s):
    return x * len(s)


@case(graphs=2, breaks=0, args=_x_and_set)
def stale_set_contains(x, s):
    return x + (3 in s)


@case(graphs=2, breaks=0, args=lambda: (torch.randn(4), frozenset(torch.randint(0, 6, (3,)).tolist())))
def stale_frozenset_sum(x, s):
    return x * sum(sorted(s))


def _x_and_deque():
    return (torch.randn(4), collections.deque(torch.randn(3).tolist()))


@case(graphs=2, breaks=1, args=_x_and_deque)
def stale_deque_sum(x, d):
    return x * sum(d)


@case(graphs=1, breaks=2, args=_x_and_deque)
def stale_deque_len_truth(x, d):
    if d:
        return x + len(d)
    return x


@case(graphs=2, breaks=1, args=lambda: (torch.randn(4), random.Random(torch.randint(0, 100, ()).item())))
def stale_random_instance(x, r):
    return x * r.random()


@case(graphs=2, breaks=1, args=lambda: (torch.randn(4), array.array("d", torch.randn(3).tolist())))
def stale_array_sum(x, a):
    return x + sum(a)


@case(graphs=2, breaks=0, args=lambda: (torch.randn(4), collections.Counter(torch.randint(0, 3, (5,)).tolist())))
def stale_counter_most_common(x, c):
    return x * c.most_common(1)[0][1]


# ---- objects made during the trace and handed back --------------------------------------------------
class _Box:
    def __init__(self, v):
        self.v = v
        self.log = []


@case(graphs=1, breaks=0)
def stale_object_made_in_trace(x, y):
    b = _Box(3)
    b.log.append("made")
    return x + y, b


@case(graphs=1, breaks=0)
def stale_list_made_in_trace(x, y):
    out = [1, 2]
    return x * y, out, {"k": out}


@case(graphs=2, breaks=1)
def stale_object_across_break(x, y):
    b = _Box(1)
    z = x + 1
    graph_break("kiln-corpus", b.v)
    b.v += 1
    return z * y, b


@case(graphs=0, breaks=0)  # the deque cannot be rebuilt per call: the frame runs eagerly (explain says so)
def stale_deque_made_in_trace(x, y):
    d = collections.deque([1, 2])
    d.append(3)
    return x + y, d
