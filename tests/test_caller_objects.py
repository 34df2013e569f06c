"""Objects a caller passes in, read by compiled code, called again and again with fresh contents
against eager.

Before: an iterator argument (``iter(xs)``) was consumed for real while the frame was traced, so a trace
that then broke or fell back ran on an exhausted iterator (``sum(x * 2 for x in it)`` returned 0,
``[x + 1 for x in it]`` returned ``[]``); a ``functools.partial``'s arguments and keywords were read
once (``f(x, partial(torch.mul, other=a))`` used the first call's ``a`` on every call); a Python
attribute set on a caller's tensor (``x.gain = 2.0``, read by ``getattr(x, "gain", 1.0)``) was never
seen (the traced tensor has none) nor guarded; a slice, range, complex number or torch.Size argument,
and an ``operator.itemgetter``/``attrgetter``/``methodcaller``, was guarded by its type only (``x[s]``
sliced with the first call's slice on every call); and a function's ``__defaults__`` replaced after
``kiln.compile`` kept the old defaults. And ``torch.func.vmap(lambda t: ...)(x)`` inside compiled code
raised "a traced function was called outside the interpreter" (vmap ran at capture time and kept the
trace's own function object)."""

from __future__ import annotations

import functools
import operator
import types

import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "inductor"]


def _loop(xs):
    acc = 0
    for x in xs:
        acc = acc + x
    return acc


CONSUMERS = {
    "generator expression": lambda xs: sum(x * 2 for x in xs),
    "list comprehension": lambda xs: [x + 1 for x in xs],
    "for loop": _loop,
    "zip": lambda xs: [a + b for a, b in zip(xs, [torch.ones(3)] * 5)],
    "enumerate": lambda xs: [x * i for i, x in enumerate(xs)],
    "map": lambda xs: list(map(lambda t: t * 3, xs)),
    "list": lambda xs: list(xs),
    "star arguments": lambda xs: (lambda a, b, *rest: a - b)(*xs),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_an_iterator_argument_is_consumed_once_as_in_eager(backend, consumer):
    fn = CONSUMERS[consumer]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for n in (3, 4, 3):
        xs = [torch.randn(3) for _ in range(n)]
        mine, ref = iter(xs), iter(xs)
        next(mine), next(ref)  # partly consumed already
        got, want = compiled(mine), fn(ref)
        torch.testing.assert_close(got, want)
        assert len(list(mine)) == len(list(ref))


def _apply(x, f):
    return f(x) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_partials_arguments_and_keywords_are_read_on_every_call(backend):
    kiln.reset()
    compiled = kiln.compile(_apply, backend=backend)
    for f in (functools.partial(torch.mul, other=2.0), functools.partial(torch.mul, other=3.0),
              functools.partial(torch.add, alpha=4.0, other=torch.ones(3)), functools.partial(torch.clamp, min=0.5)):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, f), _apply(x, f))


class _Act(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)

    def forward(self, x):
        return self.act(x)


def test_a_partial_held_by_a_module_is_guarded():
    kiln.reset()
    m = _Act()
    compiled = kiln.compile(m)
    for slope in (0.1, 0.3, 0.1):
        m.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=slope)
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x), m(x))


def _gain(x):
    return x * getattr(x, "gain", 1.0) + (1 if hasattr(x, "bias_on") else 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_python_attribute_on_a_callers_tensor_is_read_on_every_call(backend):
    kiln.reset()
    compiled = kiln.compile(_gain, backend=backend)
    for gain, bias_on in ((2.0, False), (None, False), (3.0, True), (3.0, False), (None, True)):
        x = torch.randn(4)
        if gain is not None:
            x.gain = gain
        if bias_on:
            x.bias_on = True
        torch.testing.assert_close(compiled(x), _gain(x))


VALUES = {
    "slice": (lambda x, s: x[s], [slice(0, 2), slice(1, 3), slice(0, 6, 2), slice(0, 2)]),
    "range": (lambda x, r: [x[i] for i in r], [range(0, 2), range(1, 4), range(0, 6, 2)]),
    "complex": (lambda x, c: (x * c).real, [1 + 2j, 3 - 1j, 1 + 2j]),
    "torch.Size": (lambda x, s: x.reshape(s), [torch.Size([2, 3]), torch.Size([3, 2]), torch.Size([6])]),
    "itemgetter": (lambda x, g: g([x, x * 2, x * 3]), [operator.itemgetter(0), operator.itemgetter(1),
                                                         operator.itemgetter(2, 0)]),
    "attrgetter": (lambda x, g: g(types.SimpleNamespace(a=x, b=x * 2)), [operator.attrgetter("a"),
                                                                           operator.attrgetter("b")]),
    "methodcaller": (lambda x, g: g(x), [operator.methodcaller("mul", 2), operator.methodcaller("mul", 3),
                                          operator.methodcaller("add", 1, alpha=2)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", sorted(VALUES))
def test_an_immutable_value_argument_is_guarded_by_its_value(backend, kind):
    fn, values = VALUES[kind]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for v in values:
        x = torch.randn(6)
        torch.testing.assert_close(compiled(x, v), fn(x, v))


def _scaled(x, k=2.0):
    return x * k


def test_defaults_replaced_after_compile_are_used():
    kiln.reset()
    compiled = kiln.compile(_scaled)
    try:
        for k in (2.0, 5.0, 7.0):
            _scaled.__defaults__ = (k,)
            x = torch.randn(3)
            torch.testing.assert_close(compiled(x), x * k)
    finally:
        _scaled.__defaults__ = (2.0,)


def _vmapped(x):
    return torch.func.vmap(lambda t: t.sin() * 2 + t.sum())(x)


def _grad_of(x):
    return torch.func.grad(lambda t: (t ** 3).sum())(x) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_vmapped, _grad_of], ids=["vmap", "grad"])
def test_torch_func_transforms_of_a_lambda_run_as_in_eager(backend, fn):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), fn(x))
