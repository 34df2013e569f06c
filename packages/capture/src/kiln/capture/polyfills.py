"""Pure-Python versions of builtins that compute on their arguments (sum, min, max, ...).

The interpreter inlines these instead of calling the C builtin, so tensor and size arithmetic
inside them is recorded into the graph.
"""

from __future__ import annotations

_MISSING = object()


def sum_(iterable, start=0):
    total = start
    for x in iterable:
        total = total + x
    return total


def min_(*args, key=None, default=_MISSING):
    items = list(args[0]) if len(args) == 1 else list(args)
    if not items:
        if default is _MISSING:
            raise ValueError("min() arg is an empty sequence")
        return default
    best = items[0]
    for x in items[1:]:
        if (key(x) < key(best)) if key is not None else (x < best):
            best = x
    return best


def max_(*args, key=None, default=_MISSING):
    items = list(args[0]) if len(args) == 1 else list(args)
    if not items:
        if default is _MISSING:
            raise ValueError("max() arg is an empty sequence")
        return default
    best = items[0]
    for x in items[1:]:
        if (key(x) > key(best)) if key is not None else (x > best):
            best = x
    return best


def any_(iterable):
    for x in iterable:
        if x:
            return True
    return False


def all_(iterable):
    for x in iterable:
        if not x:
            return False
    return True


def map_(fn, *iterables):
    return [fn(*xs) for xs in zip(*iterables)]


def filter_(fn, iterable):
    if fn is None:
        return [x for x in iterable if x]
    return [x for x in iterable if fn(x)]


def sorted_(iterable, key=None, reverse=False):
    items = list(iterable)
    keys = [key(x) if key is not None else x for x in items]
    order = list(range(len(items)))
    # insertion sort keeps it traceable and stable
    for i in range(1, len(order)):
        j = i
        while j > 0 and keys[order[j - 1]] > keys[order[j]]:
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    out = [items[i] for i in order]
    if reverse:
        out.reverse()
    return out


def list_sort_(items, key=None, reverse=False):
    items[:] = sorted_(items, key=key, reverse=reverse)


def chain_(*iterables):
    """itertools.chain over a generator of the trace: lazy, so the generator runs as eager's would."""
    for it in iterables:
        yield from it


def islice_(iterable, *args):
    """itertools.islice over a generator of the trace, consuming exactly what CPython's does."""
    s = slice(*args)
    start = 0 if s.start is None else s.start
    step = 1 if s.step is None else s.step
    it = iter(iterable)
    count, upcoming = 0, start
    while True:
        while count < upcoming:
            try:
                next(it)
            except StopIteration:
                return
            count += 1
        if s.stop is not None and count >= s.stop:
            return
        try:
            item = next(it)
        except StopIteration:
            return
        count += 1
        upcoming += step
        if s.stop is not None and upcoming > s.stop:
            upcoming = s.stop
        yield item


def reduce_(fn, iterable, *initial):
    it = list(iterable)
    if initial:
        acc = initial[0]
    else:
        acc, it = it[0], it[1:]
    for x in it:
        acc = fn(acc, x)
    return acc


def add_quotient_(self, tensor1, tensor2, value, inplace):
    """``self.addcdiv(_)(tensor1, tensor2, value=t)`` with a tensor ``t`` (Adam's step size when the step
    count is a tensor): the op's Scalar ``value`` would read ``t`` into Python; as tensor ops it stays
    in the graph (what PyTorch's compiler does too)."""
    import torch

    update = torch.div(tensor1, tensor2) * value
    return self.add_(update) if inplace else torch.add(self, update)


def add_product_(self, tensor1, tensor2, value, inplace):
    """``self.addcmul(_)(tensor1, tensor2, value=t)`` with a tensor ``t``, as tensor ops (add_quotient_)."""
    import torch

    update = torch.mul(tensor1, tensor2) * value
    return self.add_(update) if inplace else torch.add(self, update)
