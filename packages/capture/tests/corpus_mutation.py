"""Corpus programs: mutation of inputs (tensors in place, lists, dicts, attributes) replayed after
the graph, and mutation of locals."""

from __future__ import annotations

import torch
from torch import nn

from .corpus_registry import case, graph_break


def _list_args():
    return ([torch.randn(4, 4), torch.randn(4, 4)], torch.randn(4, 4))


def _dict_args():
    return ({"a": torch.randn(4, 4), "b": torch.randn(4, 4)}, torch.randn(4, 4))


class Holder:
    def __init__(self):
        self.t = torch.randn(4, 4)
        self.items = [torch.randn(4, 4)]
        self.count = 0
        self.cache = {}


def _holder_args():
    return (Holder(), torch.randn(4, 4))


@case()
def inplace_on_input_tensor(x, y):
    x.add_(y)
    return x * 2


@case()
def inplace_on_input_view(x, y):
    x[0].mul_(3)
    x[:, 1] = y[:, 1]
    return x.sum()


@case()
def inplace_input_returned_alias(x, y):
    x.clamp_(min=0)
    return x


@case(args=_list_args)
def input_list_append(xs, y):
    xs.append(y * 2)
    return len(xs)


@case(args=_list_args)
def input_list_pop(xs, y):
    last = xs.pop()
    return last + y


@case(args=_list_args)
def input_list_insert_and_read_shifted(xs, y):
    first = xs[0]
    xs.insert(0, y + 1)
    return first * xs[1]


@case(args=_list_args)
def input_list_setitem(xs, y):
    xs[0] = xs[0] + y
    return xs[0] * xs[1]


@case(args=_list_args)
def input_list_extend_iadd(xs, y):
    xs.extend([y, y * 2])
    xs += [y * 3]
    return sum(xs)


@case(args=_list_args)
def input_list_del_and_clear_local_copy(xs, y):
    del xs[0]
    local = list(xs)
    local.clear()
    return xs[0] + len(local)


@case(args=_list_args)
def input_list_reverse_sort(xs, y):
    xs.reverse()
    xs.sort(key=lambda t: 0)
    return xs[0] - xs[1]


@case(args=_list_args)
def input_list_slice_assign(xs, y):
    xs[:] = [y, y + 1, y + 2]
    return xs[-1]


@case(args=_dict_args)
def input_dict_setitem(d, y):
    d["c"] = d["a"] + y
    return d["c"] * 2


@case(args=_dict_args)
def input_dict_pop_update(d, y):
    a = d.pop("a")
    d.update({"z": a * y})
    return d["b"] + d["z"]


@case(args=_dict_args)
def input_dict_del_setdefault(d, y):
    del d["b"]
    v = d.setdefault("n", y)
    return v + d["a"]


@case(args=_dict_args)
def input_dict_overwrite_existing(d, y):
    d["a"] = d["a"] * y
    d["b"] += 1
    return d["a"] + d["b"]


@case(args=_holder_args)
def attribute_write_tensor(h, y):
    h.t = h.t + y
    return h.t * 2


@case(args=_holder_args)
def attribute_counter_bump(h, y):
    h.count += 1
    return y * (h.count + 1)


@case(args=_holder_args)
def attribute_list_append(h, y):
    h.items.append(y)
    return sum(h.items)


@case(args=_holder_args)
def attribute_dict_cache_fill(h, y):
    if "k" not in h.cache:
        h.cache["k"] = y * 3
    return h.cache["k"] + 1


@case(args=_holder_args)
def attribute_delete_and_new(h, y):
    del h.count
    h.fresh = y.sum()
    return y + hasattr(h, "count")


class Accum(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


_ACCUM = Accum()


@case(graphs=2, args=lambda: (torch.randn(4, 4),))  # an int attribute is a guarded constant
def module_python_attribute_counter(x):
    return _ACCUM(x) * 1


class RunningStat(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(x.mean(0) * 0.1)
        return x - self.mean


@case(graphs=2, args=lambda: (RunningStat(), torch.randn(4, 4)))  # a new module per call: identity guard
def module_buffer_inplace_update(m, x):
    return m(x) + m.mean


@case()
def local_list_mutation_no_replay(x, y):
    xs = [x]
    xs.append(y)
    xs[0] = xs[0] * 2
    del xs[1]
    return xs


@case()
def local_dict_mutation(x, y):
    d = {}
    d["a"] = x
    d["a"] += y
    d.setdefault("b", []).append(y)
    return d


@case(args=_list_args)
def mutate_then_return_input_list(xs, y):
    xs.append(y * 2)
    return xs


@case(args=lambda: ([torch.randn(4, 4)], {"a": torch.randn(4, 4)}, torch.randn(4, 4)))
def mutate_list_and_dict_together(xs, d, y):
    xs.append(d.pop("a"))
    d["b"] = xs[0] + y
    return len(xs) + len(d)


@case(graphs=2, breaks=1, args=_list_args)
def mutation_before_break(xs, y):
    xs.append(y * 2)
    graph_break("kiln-corpus after append", len(xs))
    return xs[-1] + 1


@case(graphs=2, breaks=1, args=_holder_args)
def attribute_write_before_break(h, y):
    h.count = 5
    h.t = y * 2
    graph_break("kiln-corpus after attr")
    return h.t + h.count
