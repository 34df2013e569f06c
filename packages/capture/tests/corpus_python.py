"""Corpus programs: Python values, control flow, containers, functions, classes."""

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

from .corpus_registry import case, one, two  # noqa: F401


# ---- Python values -------------------------------------------------------------------------
@case()
def python_arith(x, y):
    a = 3
    b = a * 2 + 1
    c = b // 2 - a % 2
    return x * c + y * (b ** 2) / 7


@case()
def float_math(x, y):
    return x * math.sqrt(16) + y * math.pi + math.floor(2.7)


@case()
def operator_module(x, y):
    return operator.add(x, y) + operator.mul(x, 2)


@case()
def bool_logic(x, y):
    a, b = True, False
    if a and not b:
        x = x + 1
    if a or b:
        y = y * 2
    return x + y


@case()
def comparisons_chain(x, y):
    n = 3
    if 0 < n < 5:
        return x + n
    return y


@case()
def if_on_shape(x, y):
    if x.shape[0] == 4:
        return x + y
    return x - y


@case()
def if_on_dim(x, y):
    if x.dim() > 1 and x.size(-1) > 2:
        return x.sum(-1)
    return x


@case()
def if_none_arg(x, y):
    def inner(a, b=None):
        if b is None:
            return a * 2
        return a + b
    return inner(x) + inner(x, y)


@case()
def isinstance_checks(x, y):
    out = x
    if isinstance(x, torch.Tensor):
        out = out + 1
    if isinstance(3, (int, float)):
        out = out + 2
    if not isinstance(y, (list, tuple)):
        out = out + y
    return out


@case()
def fstrings(x, y):
    name = f"layer_{3}_{'a'}"
    if name.startswith("layer") and name.upper().endswith("_A"):
        return x + len(name)
    return y


@case()
def string_methods(x, y):
    parts = "a,b,c".split(",")
    joined = "-".join(parts)
    return x * len(joined) + y * len(parts)


@case()
def ternary(x, y):
    k = 2 if x.shape[0] > 2 else 3
    return x * k


@case()
def while_loop(x, y):
    i = 0
    while i < 3:
        x = x + y
        i += 1
    return x


@case()
def for_range(x, y):
    for i in range(3):
        x = x * 2 + i
    return x


@case()
def for_range_step(x, y):
    for i in range(10, 0, -3):
        x = x + i
    return x


@case()
def nested_loops(x, y):
    for i in range(2):
        for j in range(2):
            x = x + y * (i + j)
    return x


@case()
def loop_break_continue(x, y):
    for i in range(10):
        if i == 1:
            continue
        if i == 4:
            break
        x = x + i
    return x


@case()
def loop_else(x, y):
    for _i in range(2):
        x = x + 1
    else:
        x = x * 2
    return x


@case()
def for_over_list(x, y):
    for t in [x, y, x * y]:
        x = x + t
    return x


@case()
def enumerate_zip(x, y):
    out = 0
    for i, (a, b) in enumerate(zip([x, y], [y, x])):
        out = out + a * b * i
    return out


@case()
def for_dict_items(x, y):
    d = {"a": x, "b": y}
    out = x * 0
    for k, v in d.items():
        out = out + v * len(k)
    for k in d:
        out = out + d[k]
    return out


@case()
def reversed_sorted(x, y):
    out = x
    for i in reversed(range(3)):
        out = out * 2 + i
    for v in sorted([3, 1, 2]):
        out = out + v
    return out


@case()
def builtins_reduce(x, y):
    vals = [1, 5, 3]
    return x * sum(vals) + y * max(vals) - min(vals) + abs(-2) + int(all(vals)) + int(any([0, 1]))


@case()
def sum_of_tensors(x, y):
    return sum([x, y, x * y])


@case()
def max_of_tensors(x, y):
    return max(x.sum(), y.sum()) if False else torch.maximum(x, y)


@case()
def abs_tensor(x, y):
    return abs(x) + abs(y)


@case()
def list_ops(x, y):
    xs = [x]
    xs.append(y)
    xs.extend([x + 1, y + 1])
    xs.insert(0, x * 0)
    last = xs.pop()
    xs.reverse()
    return torch.stack(xs).sum(0) + last + len(xs)


@case()
def list_comprehension(x, y):
    return torch.stack([x * i for i in range(3)]).sum(0)


@case()
def list_comp_filter(x, y):
    return sum([x * i for i in range(6) if i % 2 == 0])


@case()
def dict_comprehension(x, y):
    d = {f"k{i}": x + i for i in range(3)}
    return d["k0"] + d["k2"]


@case()
def set_ops(x, y):
    s = {1, 2, 3}
    s.add(4)
    s2 = s | {5}
    return x * len(s2) + (y if 3 in s else x)


@case()
def generator_expr(x, y):
    return sum(t * 2 for t in (x, y))


@case()
def tuple_unpack_star(x, y):
    a, *rest = (x, y, x + y)
    return a + rest[0] + rest[1]


@case()
def slicing_lists(x, y):
    xs = [x, y, x + y, x - y]
    return sum(xs[1:3]) + xs[-1] + sum(xs[::2])


@case()
def dict_methods(x, y):
    d = {"a": x}
    d["b"] = y
    d.update({"c": x * y})
    v = d.get("z", x)
    keys = list(d.keys())
    d.pop("a")
    return v + d["b"] + d["c"] + len(keys) + d.setdefault("q", y)


@case()
def dict_kwargs_unpack(x, y):
    def inner(a, b, scale=1):
        return (a + b) * scale
    kw = {"b": y, "scale": 3}
    return inner(x, **kw)


@case()
def star_args_call(x, y):
    def inner(*args, **kwargs):
        return sum(args) * kwargs.get("k", 1)
    parts = [x, y]
    return inner(*parts, k=2)


@case()
def default_and_kwonly(x, y):
    def inner(a, b=2, *, c=3, d):
        return a * b + c + d
    return inner(x, d=y) + inner(x, 1, c=0, d=y)


@case()
def closures(x, y):
    scale = 3

    def inner(t):
        return t * scale
    return inner(x) + inner(y)


@case()
def nonlocal_counter(x, y):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t + count
    a = bump(x)
    b = bump(y)
    return a + b + count


@case()
def lambdas(x, y):
    f = lambda t, k=2: t * k  # noqa: E731
    return f(x) + f(y, 3)


@case()
def nested_functions_deep(x, y):
    def a(t):
        def b(t):
            def c(t):
                return t + 1
            return c(t) * 2
        return b(t) - 1
    return a(x) + a(y)


@case()
def recursion(x, y):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(4)


@case()
def partial_fn(x, y):
    f = functools.partial(torch.add, alpha=2)
    return f(x, y)


@case()
def partial_user(x, y):
    def scale(t, k):
        return t * k
    g = functools.partial(scale, k=3)
    return g(x) + g(y)


@case()
def try_except_no_raise(x, y):
    try:
        z = x + y
    except ValueError:
        z = x - y
    return z


@case()
def try_except_raises(x, y):
    try:
        raise KeyError("k")
    except KeyError:
        z = x * 2
    return z


@case()
def try_finally(x, y):
    try:
        z = x + 1
    finally:
        z2 = y + 1
    return z + z2


@case()
def assert_ok(x, y):
    assert x.shape == y.shape, "shapes"
    return x + y


@case()
def with_no_grad(x, y):
    with torch.no_grad():
        z = x * 2
    return z + y


@case()
def with_enable_grad(x, y):
    with torch.no_grad():
        with torch.enable_grad():
            z = x * 2
    return z + y


@case()
def set_grad_enabled_ctx(x, y):
    with torch.set_grad_enabled(False):
        z = x + y
    return z


@case()
def is_grad_enabled_branch(x, y):
    if torch.is_grad_enabled():
        return x + y
    return x - y


Point = collections.namedtuple("Point", ["a", "b"])


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


@case()
def namedtuples(x, y):
    p = Point(x, y)
    q = Pair(left=x, right=y)
    return p.a + p[1] + q.left * q.right


@case()
def return_namedtuple(x, y):
    return Pair(x + 1, y - 1)


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    shift: int = 1


@case()
def dataclass_local(x, y):
    c = Config(scale=3.0)
    return x * c.scale + c.shift


class Affine:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        return t * self.k

    @property
    def double(self):
        return self.k * 2

    @staticmethod
    def smethod(t):
        return t + 1

    @classmethod
    def make(cls, k):
        return cls(k)


@case()
def user_class(x, y):
    a = Affine.make(3)
    return a.apply(x) + a.double + Affine.smethod(y)


class Base:
    def f(self, t):
        return t + 1


class Derived(Base):
    def f(self, t):
        return super().f(t) * 2


@case()
def super_calls(x, y):
    return Derived().f(x)


@case()
def getattr_hasattr(x, y):
    a = Affine(2)
    out = x
    if hasattr(a, "k"):
        out = out + a.k
    if not hasattr(a, "nope"):
        out = out + getattr(a, "nope", 5)
    a.k = 7
    return out + a.k


@case()
def global_constant(x, y):
    return x * GLOBAL_SCALE + y


GLOBAL_SCALE = 3


def helper_global(t):
    return t * 2 + GLOBAL_SCALE


@case()
def global_function(x, y):
    return helper_global(x) + helper_global(y)


GLOBAL_TENSOR = torch.randn(4, 4)


@case()
def global_tensor(x, y):
    return x + GLOBAL_TENSOR


@case()
def torch_finfo(x, y):
    return x.clamp(min=torch.finfo(x.dtype).min) + y


@case()
def type_checks(x, y):
    if int is int and callable(len):
        return x + y
    return x


@case()
def chained_compare_tensor_meta(x, y):
    if x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad:
        return x + 1
    return x


@case()
def in_operator(x, y):
    names = ["a", "b"]
    if "a" in names and "c" not in names:
        return x + y
    return x


@case()
def math_on_shapes(x, y):
    d = x.shape[-1]
    return x / math.sqrt(d) + y * math.log(d)


@case()
def string_format(x, y):
    s = "{}-{}".format("a", 3) + "%d" % 4  # noqa: UP031 (the program under test uses %)
    return x * len(s)
