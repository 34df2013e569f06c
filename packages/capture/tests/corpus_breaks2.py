"""Corpus programs: more graph breaks — in loops, callees, with blocks, methods, comprehensions —
and the state (locals, stack, grad mode, containers) the resume functions must restore."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

import kiln.capture as kc

from .corpus_registry import case, graph_break, one


def _inner_break(t):
    u = t * 2
    graph_break("kiln-corpus", "inner")
    return u + 1


def _outer_calls_inner(t):
    return _inner_break(t) - 3


class _Opaque:
    """A C-level call kiln cannot trace: tensors go through a Python-side hook."""

    @staticmethod
    @kc.disable(reason="the corpus's opaque call")
    def apply(t):
        return t.detach() * 2


@case(graphs=4, breaks=3)
def break_two_levels_deep(x, y):
    return _outer_calls_inner(x) * y


@case(graphs=3, breaks=3)
def break_in_callee_twice(x, y):
    return _inner_break(x) + _inner_break(y)


@case(graphs=1, breaks=0)  # NumPy is traced as tensor code (numpy_trace.py): no break
def break_on_numpy_roundtrip(x, y):
    a = x + 1
    b = torch.from_numpy(a.numpy() * 2)
    return b + y


@case(graphs=2, breaks=1)
def break_keeps_stack_values(x, y):
    return (x + 1) * (graph_break("kiln-corpus", "mid") or 1) + y


@case(graphs=2, breaks=1)
def break_inside_list_literal(x, y):
    items = [x + 1, graph_break("kiln-corpus", "in list") or y, x * y]
    return items[0] + items[1] + items[2]


@case(graphs=2, breaks=1)
def break_inside_call_args(x, y):
    return torch.add(x * 2, y, alpha=(graph_break("kiln-corpus", "arg") or 2))


@case(graphs=2, breaks=1)
def break_in_enable_grad_block(x, y):
    with torch.no_grad():
        with torch.enable_grad():
            a = x * 2
            graph_break("kiln-corpus", "enable_grad")
            b = a + y
    return b, torch.is_grad_enabled()


@case(graphs=2, breaks=1)
def break_in_set_grad_enabled_false(x, y):
    with torch.set_grad_enabled(False):
        a = x + 1
        graph_break("kiln-corpus", "set_grad_enabled")
        b = a * y
    return b


@case(graphs=2, breaks=1)
def break_after_with_block(x, y):
    with torch.no_grad():
        a = x * 3
    graph_break("kiln-corpus", "after with")
    return a + y


@case(graphs=2, breaks=2)
def break_in_while_loop(x, y):
    i = 0
    while i < 2:
        x = x + y
        graph_break("kiln-corpus", "while", i)
        i += 1
    return x


@case(graphs=2, breaks=1)
def break_in_loop_last_iteration_only(x, y):
    for i in range(3):
        x = x * 2
        if i == 2:
            graph_break("kiln-corpus", "last")
    return x + y


@case(graphs=2, breaks=2)
def break_in_loop_over_list(x, y):
    out = x
    for t in [x, y]:
        out = out + t
        graph_break("kiln-corpus", "list loop")
    return out


@case(graphs=2, breaks=2)
def break_in_loop_over_dict_items(x, y):
    d = {"a": x, "b": y}
    out = x * 0
    for k, v in d.items():
        out = out + v
        graph_break("kiln-corpus", "dict loop", k)
    return out


@case(graphs=1, breaks=1)
def break_with_local_containers_mutated_after(x, y):
    acc = [x]
    graph_break("kiln-corpus", "before append")
    acc.append(y)
    return torch.stack(acc).sum(0)


@case(graphs=2, breaks=1)
def break_with_dict_and_closure_alive(x, y):
    scale = {"k": 2}

    def f(t):
        return t * scale["k"]
    a = f(x)
    graph_break("kiln-corpus", "closure dict")
    scale["k"] = 3
    return a + f(y)


@case(graphs=2, breaks=1)
def break_then_return_tuple(x, y):
    a = x.relu()
    graph_break("kiln-corpus", "tuple")
    return a, y.sigmoid(), 3


@case(graphs=3, breaks=2)
def break_in_method_of_user_object(x, y):
    class Stage:
        def __init__(self, k):
            self.k = k

        def go(self, t):
            t = t * self.k
            graph_break("kiln-corpus", "method")
            return t + 1
    return Stage(2).go(x) * y


# a generator live at a break (not started): remade after the graph as a real generator, which the resume
# functions advance in Python, a break per step (torch.compile runs this frame eagerly)
@case(graphs=1, breaks=5)
def break_unsupported_generator_callee(x, y):
    def gen():
        yield 1
        yield 2
    total = 0
    g = gen()
    graph_break("kiln-corpus", "generator object")
    for v in g:
        total += v
    return x * total


@case(graphs=5, breaks=3, args=lambda: (torch.randn(4, 4).abs() + 0.1, torch.randn(4, 4)))  # one break per iteration
def break_data_dependent_while(x, y):
    z = x * 1
    while z.max() > 1:
        z = z / 2
    return z + y


@case(graphs=3, breaks=1)  # the Python value differs per call: specialised, recompiled
def break_item_then_python_math(x, y):
    s = float(x.mean())
    k = round(s * 100) / 100
    return y * k


@case(graphs=2, breaks=1, args=lambda: (torch.randn(4, 4).abs(), torch.randn(4, 4)))
def break_on_bool_of_tensor(x, y):
    if bool((x > 0).all()):
        return x + y
    return x - y


@case(graphs=2, breaks=1, args=lambda: (torch.tensor([0.5, 1.5, 2.5, 3.5]), torch.randn(4)))
def break_on_nonzero_shape(x, y):
    idx = torch.nonzero(x > 1).flatten()
    return y[idx].sum() + x.sum()


class _BreakingModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        h = F.relu(self.a(x))
        graph_break("kiln-corpus", "module")
        return self.b(h)


_BM = _BreakingModule()


@case(graphs=3, breaks=2, args=one)
def break_inside_module_forward(x):
    return _BM(x) + 1


@case(graphs=2, breaks=2)
def break_in_lambda(x, y):
    f = lambda t: graph_break("kiln-corpus", "lambda") or t * 2  # noqa: E731
    return f(x) + y


@case(graphs=2, breaks=1)
def break_in_nested_try(x, y):
    try:
        try:
            a = x + 1
            graph_break("kiln-corpus", "nested try")
        finally:
            b = y * 2
    except ValueError:
        a, b = x, y
    return a + b


@case(graphs=1, breaks=1)
def break_with_kwargs_unpack_after(x, y):
    kw = {"alpha": 2}
    graph_break("kiln-corpus", "kwargs")
    return torch.add(x, y, **kw)


@case(graphs=1, breaks=1)
def break_with_star_args_after(x, y):
    args = (x, y)
    graph_break("kiln-corpus", "star args")
    return torch.maximum(*args)


# Python 3.12 inlines comprehensions (PEP 709): the break is in the frame itself, not in a callee
@case(graphs=2 if sys.version_info < (3, 12) else 1, breaks=2 if sys.version_info < (3, 12) else 1)
def break_in_comprehension_element(x, y):
    return sum([graph_break("kiln-corpus", "comp") or t * 2 for t in (x,)]) + y


# A break inside a call rolls the whole call back; what the call did to Python state goes back too.
def _identity_then_break(t):
    u = t.to(t.dtype)  # returns ``t`` itself: the tracer maps that object to the new node
    return _Opaque.apply(u) + u


@case(graphs=4, breaks=2)
def break_after_method_returning_self(x, y):
    z = x * 1.5
    return _identity_then_break(z) * y + z  # z is live at the break: it must name the mul, not the erased to


class _Layer:
    def __init__(self):
        self.keys = None


class _Cache:
    """HF's DynamicCache in miniature: tensors kept on objects in a list, updated by attribute writes."""

    def __init__(self):
        self.layers = [_Layer()]

    def update(self, k):
        layer = self.layers[0]
        layer.keys = k if layer.keys is None else torch.cat([layer.keys, k])
        return layer.keys

    def update_then_break(self, k):
        keys = self.update(k)
        return _Opaque.apply(keys) + keys


@case(graphs=4, breaks=2)
def break_with_cache_made_in_the_trace(x, y):
    cache = _Cache()
    a = cache.update(x + 1)  # the cache escapes to the code after the break, holding a graph value
    b = cache.update_then_break(y * 2)  # the write to layer.keys is undone with the call that breaks
    return a.sum() + b.sum() + cache.layers[0].keys.sum()
