"""Corpus: generators inside compiled code, run lazily (generators.py): generator functions and
expressions consumed by ``for``, ``sum``/``list``/``max``/``dict``, ``zip``/``enumerate``/``map``,
unpacking, ``next``/``send``, ``yield from``; side effects interleaved with the consumer as in eager.
A generator that outlives the graph is a real one (remade after the graph when it has not started,
else made in Python); torch.compile runs such frames eagerly."""

import itertools

import torch

from .corpus_registry import case, graph_break


def _gen(xs):
    for x in xs:
        yield x * 2


def _logged(xs, log):
    for i, x in enumerate(xs):
        log.append(f"pre{i}")
        yield x + i
        log.append(f"post{i}")


def _count(start=0):
    i = start
    while True:
        yield i
        i += 1


def _inner(xs):
    for x in xs:
        yield x.relu()
    return len(xs)


def _outer(xs):
    n = yield from _inner(xs)
    yield xs[0] * n
    yield from [xs[-1], xs[-1] + 1]


def _accumulate():
    total = 0
    while True:
        v = yield total
        if v is None:
            return total
        total = total + v


def _pairs(xs):
    for a, b in zip(xs, xs[1:]):
        yield a @ b.T


class _Layers:
    def __init__(self, fns):
        self.fns = fns

    def __iter__(self):  # a generator method as the iteration protocol
        yield from self.fns


def _first_two_negated(xs):
    for i, x in enumerate(xs):
        if i == 2:
            return
        yield -x


def _raises_after_one(xs):
    yield xs[0]
    raise ValueError("kiln-corpus")


def _rows_summed(xs):
    for row in _gen(xs):
        yield sum(r for r in row)


def _item_of_each(xs):
    for x in xs:
        yield x.sum().item()  # a break inside the generator's body


@case(graphs=1, breaks=0)
def gen_sum_of_generator(x, y):
    return sum(_gen([x, y + 1]))


@case(graphs=1, breaks=0)
def gen_list_and_stack(x, y):
    return torch.stack(list(_gen([x, y * 3])))


@case(graphs=1, breaks=0)
def gen_side_effects_interleaved(x, y):
    log, out = [], []
    for t in _logged([x, y, x * y], log):
        log.append("body")
        out.append(t.cos())
    return torch.stack(out), log


@case(graphs=1, breaks=0)
def gen_infinite_zipped(x, y):
    out = x
    for i, t in zip(_count(1), [y, x.sin()]):
        out = out + i * t
    return out


@case(graphs=1, breaks=0)
def gen_yield_from_return_value(x, y):
    return torch.stack(list(_outer([x, -y])))


@case(graphs=1, breaks=0)
def gen_send_protocol(x, y):
    g = _accumulate()
    next(g)
    g.send(x)
    return g.send(y * 2)


@case(graphs=1, breaks=0)
def gen_next_with_default(x, y):
    g = _gen([x])
    a = next(g)
    b = next(g, None)
    return a + y, b is None


@case(graphs=1, breaks=0)
def gen_enumerate_map_max(x, y):
    outs = [i * t for i, t in enumerate(map(torch.tanh, _gen([x, y + 2, x - 1])))]
    return sum(outs), torch.stack(list(_pairs([x, y.T, x]))).sum(0)


@case(graphs=1, breaks=0)
def gen_iter_method(x, y):
    for f in _Layers([torch.sin, torch.cos, torch.exp]):
        x = f(x)
    return x * y


@case(graphs=1, breaks=0)
def gen_early_return(x, y):
    return list(_first_two_negated([x, y, x, y]))


@case(graphs=1, breaks=0)
def gen_exception_caught(x, y):
    out = []
    try:
        for t in _raises_after_one([x, y]):
            out.append(t + 1)
    except ValueError:
        out.append(y * 0)
    return out


@case(graphs=1, breaks=0)
def gen_unpack_and_star(x, y):
    a, b, c = _gen([x, y, x + 2])
    return a * b - c, [*_gen([x]), *_gen([y])]


@case(graphs=1, breaks=0)
def gen_nested_generators(x, y):
    return torch.stack(list(_rows_summed([x, y * 2])))


@case(graphs=1, breaks=0)
def gen_dict_and_tuple(x, y):
    d = dict((f"k{i}", t) for i, t in enumerate(_gen([x, y])))
    return d, tuple(_gen([x]))


@case(graphs=1, breaks=0)
def gen_stop_iteration_in_body(x, y):
    def bad():
        yield x
        next(iter([]))
    try:
        list(bad())
    except RuntimeError:  # PEP 479
        return x - y
    return x


@case(graphs=1, breaks=0)
def gen_any_all_short_circuit(x, y):
    hit = any(i > 2 for i in _count())  # stops at the first True, as in eager
    return x * hit, all(t.shape[0] == 4 for t in _gen([x, y]))


@case(graphs=1, breaks=2)
def gen_live_at_break_unstarted(x, y):
    g = _gen([x, y + 1])
    graph_break()
    return sum(g)


@case(graphs=3, breaks=2)
def gen_break_in_body(x, y):
    return sum(_item_of_each([x, y + 1])) * x


@case(graphs=1, breaks=0)
def gen_itertools_islice_chain(x, y):
    log, out = [], []
    for t in itertools.islice(itertools.chain(_logged([x, y], log), _gen([x])), 1, 3):
        log.append("body")
        out.append(t)
    return out, log


@case(graphs=1, breaks=0)
def gen_itertools_islice_endless(x, y):
    return [x * i + y for i in itertools.islice(_count(), 2, 8, 3)]
