"""Corpus programs: functions, closures, classes, dataclasses, namedtuples, properties, super()."""

from __future__ import annotations

import abc
import dataclasses
import enum
import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .corpus_registry import case


def _scaled(t, k=2):
    return t * k


def _apply_twice(fn, t):
    return fn(fn(t))


def _variadic(*ts, scale=1, **named):
    return sum(ts) * scale + sum(named.values())


@case()
def higher_order_function(x, y):
    return _apply_twice(lambda t: t + 1, x) + _apply_twice(torch.sin, y)


@case()
def function_returning_function(x, y):
    def make(k):
        def inner(t):
            return t * k
        return inner
    return make(2)(x) + make(3)(y)


@case()
def closure_over_loop_variable(x, y):
    fns = [lambda t, i=i: t * i for i in range(3)]
    return fns[2](x) + fns[1](y)


@case()
def late_binding_closure(x, y):
    fns = [lambda t: t * i for i in range(3)]  # noqa: B023 (late binding is the point)
    return fns[0](x) + fns[1](y)


@case()
def closure_over_tensor(x, y):
    bias = y * 2

    def add_bias(t):
        return t + bias
    return add_bias(x)


@case()
def closure_cell_rebound(x, y):
    k = 1

    def get():
        return k
    k = 5
    return x * get()


@case()
def nonlocal_list_append(x, y):
    acc = []

    def push(t):
        acc.append(t)
    push(x)
    push(y)
    return sum(acc)


@case()
def global_function_with_default(x, y):
    return _scaled(x) + _scaled(y, k=3)


@case()
def variadic_mixed_call(x, y):
    return _variadic(x, y, scale=2, a=1, b=2)


@case()
def variadic_star_star_forward(x, y):
    def outer(*args, **kwargs):
        return _variadic(*args, **kwargs)
    return outer(x, y, scale=3)


@case()
def positional_only_args(x, y):
    def f(a, b, /, c=1):
        return a * b + c
    return f(x, y, c=2) + f(x, y)


@case()
def keyword_args_reordered(x, y):
    def f(a, b, c):
        return a - b * c
    return f(c=2, b=y, a=x)


@case()
def default_mutable_read_only(x, y):
    def f(t, scales=(1, 2, 3)):
        return t * sum(scales)
    return f(x) + f(y, (1,))


@case()
def recursive_tree_sum(x, y):
    def total(node):
        if isinstance(node, torch.Tensor):
            return node
        return sum(total(n) for n in node)
    return total([x, [y, [x, y]]])


@case()
def mutual_recursion(x, y):
    def even(n):
        return True if n == 0 else odd(n - 1)

    def odd(n):
        return False if n == 0 else even(n - 1)
    return x * even(4) + y * odd(3)


@case()
def lambda_immediately_called(x, y):
    return (lambda a, b: a * b)(x, y)


@case()
def lambda_with_star_args(x, y):
    f = lambda *ts: sum(ts)  # noqa: E731
    return f(x, y, x)


@case()
def functools_reduce_tensors(x, y):
    return functools.reduce(lambda a, b: a * b, [x, y, x + 1])


@case()
def functools_reduce_initial(x, y):
    return functools.reduce(lambda a, b: a + b, [x, y], torch.ones(4, 4))


@case()
def partial_positional_and_kw(x, y):
    f = functools.partial(F.leaky_relu, negative_slope=0.2)
    g = functools.partial(torch.cat, dim=1)
    return f(x).sum() + g([x, y]).sum(1)


@case()
def partial_nested(x, y):
    def f(a, b, c):
        return a * b + c
    g = functools.partial(functools.partial(f, x), y)
    return g(1)


@case()
def functools_wraps_decorator(x, y):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a):
            return fn(*a) * 2
        return wrapper

    @deco
    def add(a, b):
        return a + b
    return add(x, y)


@case()
def decorator_with_argument(x, y):
    def times(k):
        def deco(fn):
            return lambda *a: fn(*a) * k
        return deco

    @times(3)
    def sub(a, b):
        return a - b
    return sub(x, y)


@case()
def lru_cached_helper_pure(x, y):
    return x * _cached_factor(3)


@functools.lru_cache(maxsize=None)  # noqa: UP033
def _cached_factor(n):
    return n * 2


class Counter2:
    instances = 0

    def __init__(self, start):
        self.value = start
        Counter2.instances += 0  # class attribute read/write of the same value

    def bump(self, by=1):
        self.value += by
        return self

    def __call__(self, t):
        return t * self.value


@case()
def method_chaining_object(x, y):
    c = Counter2(1).bump().bump(2)
    return c(x) + c.value


@case()
def callable_object(x, y):
    c = Counter2(3)
    return c(x) + c(y)


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __rmul__(self, k):
        return Vec(self.t * k)

    def __neg__(self):
        return Vec(-self.t)

    def __len__(self):
        return self.t.shape[0]

    def __getitem__(self, i):
        return self.t[i]

    def __eq__(self, other):
        return isinstance(other, Vec) and other.t is self.t

    def __iter__(self):
        return iter([self.t, self.t * 2])

    def __contains__(self, k):
        return k == "t"

    def __bool__(self):
        return True


@case()
def dunder_operators(x, y):
    v = Vec(x) + Vec(y) * 2
    w = 3 * (-v)
    return w.t + len(v) + v[0]


@case()
def dunder_iter_contains_bool(x, y):
    v = Vec(x)
    a, b = v
    out = a + b
    if "t" in v and v:
        out = out + y
    return out


@case()
def dunder_eq(x, y):
    v = Vec(x)
    return x * (v == v) + y * (v == Vec(y))


class Shape:
    def __init__(self, w, h):
        self._w = w
        self._h = h

    @property
    def area(self):
        return self._w * self._h

    @property
    def w(self):
        return self._w

    @w.setter
    def w(self, v):
        self._w = v

    def __repr__(self):
        return f"Shape({self._w}, {self._h})"


@case()
def property_setter(x, y):
    s = Shape(2, 3)
    s.w = 4
    return x * s.area + y * s.w


@case()
def repr_of_user_object(x, y):
    return x * len(repr(Shape(1, 2)))


class Animal(abc.ABC):
    @abc.abstractmethod
    def scale(self):
        ...

    def apply(self, t):
        return t * self.scale()


class Cat(Animal):
    def scale(self):
        return 3


@case()
def abstract_base_method(x, y):
    return Cat().apply(x) + isinstance(Cat(), Animal)


class A:
    def f(self, t):
        return t + 1


class B(A):
    def f(self, t):
        return super().f(t) * 2


class C(A):
    def f(self, t):
        return super().f(t) - 3


class D(B, C):
    def f(self, t):
        return super().f(t) + 10


@case()
def super_diamond_mro(x, y):
    return D().f(x) + len(D.__mro__)


class WithClassVar:
    factor = 4

    @classmethod
    def scaled(cls, t):
        return t * cls.factor


class Sub(WithClassVar):
    factor = 5


@case()
def classmethod_inheritance(x, y):
    return WithClassVar.scaled(x) + Sub.scaled(y) + Sub().scaled(x)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


@case()
def slots_class(x, y):
    s = Slotted(x, y)
    return s.a * s.b


class GetattrFallback:
    def __init__(self):
        self.real = 2

    def __getattr__(self, name):
        return 7


@case()
def dunder_getattr_fallback(x, y):
    g = GetattrFallback()
    return x * g.real + y * g.missing


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    scale: float = 1.0

    def combined(self):
        return (self.x + self.y) * self.scale


@case()
def dataclass_with_tensors(x, y):
    b = Batch(x, y, scale=2.0)
    return b.combined()


@case()
def dataclass_replace_fields(x, y):
    b = Batch(x, y)
    b2 = dataclasses.replace(b, scale=3.0)
    names = [f.name for f in dataclasses.fields(b2)]
    return b2.combined() + len(names)


@case()
def dataclass_as_argument(x, y):
    return _use_batch(Batch(x, y, 0.5))


def _use_batch(b):
    return b.x * b.scale - b.y


@dataclasses.dataclass(frozen=True)
class FrozenCfg:
    dim: int = 4
    act: str = "relu"


@case()
def frozen_dataclass_config(x, y):
    cfg = FrozenCfg(act="gelu")
    fn = F.gelu if cfg.act == "gelu" else F.relu
    return fn(x) * cfg.dim


@case()
def dataclass_returned(x, y):
    return Batch(x + 1, y - 1, 2.0)


class Out(NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None = None


@case()
def namedtuple_defaults_replace(x, y):
    o = Out(x)
    o2 = o._replace(loss=y.sum())
    return o2.logits + o2.loss + (o.loss is None)


@case()
def namedtuple_unpack_and_fields(x, y):
    logits, loss = Out(x, y)
    return logits * len(Out._fields) + loss


@case()
def namedtuple_asdict(x, y):
    d = Out(x, y)._asdict()
    return d["logits"] - d["loss"]


@case()
def namedtuple_returned_nested(x, y):
    return Out(x * 2, loss=(y * 3).sum()), 1


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@case()
def enum_members(x, y):
    c = Color.BLUE
    if c is Color.BLUE and c.value == 2 and c.name == "BLUE":
        return x * c.value
    return y


@case()
def enum_lookup(x, y):
    return x * Color(1).value + y * Color["BLUE"].value


class Registry:
    table = {"double": lambda t: t * 2, "neg": lambda t: -t}


@case()
def dispatch_through_dict_of_lambdas(x, y):
    return Registry.table["double"](x) + Registry.table["neg"](y)


@case()
def getattr_dynamic_name(x, y):
    name = "s" + "in"
    return getattr(torch, name)(x) + getattr(y, "cos")()  # noqa: B009


@case()
def setattr_on_local_object(x, y):
    s = Shape(1, 1)
    setattr(s, "_h", 5)  # noqa: B010
    return x * s.area


@case()
def staticmethod_via_instance(x, y):
    class K:
        @staticmethod
        def f(t):
            return t * 4
    return K().f(x) + K.f(y)


@case()
def local_class_definition(x, y):
    class Local:
        def __init__(self, k):
            self.k = k

        def go(self, t):
            return t * self.k
    return Local(2).go(x) + Local(3).go(y)
