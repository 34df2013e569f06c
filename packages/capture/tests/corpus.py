"""A corpus of small programs: each is run eagerly and through kiln.capture.optimize."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Case:
    fn: Callable
    args: Callable[[], tuple]
    graphs: int
    breaks: int
    name: str
    kwargs: Callable[[], dict] = dict


CASES: list[Case] = []


def two():
    return (torch.randn(4, 4), torch.randn(4, 4))


def one():
    return (torch.randn(4, 4),)


def case(graphs: int = 1, breaks: int = 0, args: Callable[[], tuple] = two, kwargs=dict):
    def register(fn):
        CASES.append(Case(fn, args, graphs, breaks, fn.__name__, kwargs))
        return fn
    return register


# ---- straight-line tensor code -------------------------------------------------------------
@case()
def add(x, y):
    return x + y


@case()
def arith_mix(x, y):
    return (x * 2 - y / 3) ** 2 % 5 // 1


@case()
def matmul_op(x, y):
    return x @ y


@case()
def torch_functions(x, y):
    return torch.sin(x) + torch.cos(y) + torch.exp(-x.abs())


@case()
def tensor_methods(x, y):
    return x.relu().sum(dim=0) + y.mean(0).sigmoid()


@case()
def functional_ops(x, y):
    return F.softmax(x, dim=-1) + F.gelu(y) + F.layer_norm(x, (4,))


@case()
def inplace_local(x, y):
    z = x.clone()
    z.add_(y)
    z.mul_(2)
    return z


@case()
def views(x, y):
    return x.view(2, 8).transpose(0, 1).reshape(-1) + y.flatten()


@case()
def indexing(x, y):
    return x[0] + x[:, 1] + x[1:3, ::2].sum() + y[..., -1]


@case()
def tensor_setitem(x, y):
    z = x.clone()
    z[0] = 1.0
    z[:, 1] = y[:, 0]
    return z


@case()
def comparison_ops(x, y):
    return (x > y).float() + (x <= 0).to(torch.float32) + torch.where(x == y, x, y)


@case()
def unary_ops(x, y):
    return -x + (+y) + ~(x > 0).int()


@case()
def factories(x, y):
    return x + torch.ones(4, 4) + torch.zeros_like(y) + torch.arange(4.0)


@case()
def shape_arith(x, y):
    b, n = x.shape
    return x.reshape(b * n) * n + y.view(-1)[: b * 2].sum()


@case()
def size_calls(x, y):
    return x.new_zeros(x.size(0), y.size(1)) + x.dim() + x.numel()


@case()
def dtype_device(x, y):
    return x.to(y.dtype).to(y.device) + torch.zeros(4, dtype=x.dtype, device=x.device)


@case()
def transpose_attr(x, y):
    return x.T @ y.mT


@case()
def cat_stack(x, y):
    return torch.cat([x, y], dim=0).sum(0) + torch.stack((x, y)).mean(0)


@case()
def split_chunks(x, y):
    a, b = x.chunk(2, dim=1)
    c, d = torch.split(y, 2)
    return a.sum() + b.sum() + c.mean() + d.mean()


@case()
def unbind_unpack(x, y):
    r0, r1, r2, r3 = x
    return r0 + r1 * r2 - r3 + y[0]


@case()
def reductions(x, y):
    return x.max(dim=0).values + torch.min(y, dim=1)[0] + x.argmax(0).float()


@case()
def returns_input(x, y):
    return x, y + 1


@case()
def returns_dict(x, y):
    return {"a": x + 1, "b": [y, x * y]}


@case()
def returns_none_and_consts(x, y):
    return None, 3, "s", x + y


@case()
def einsum_op(x, y):
    return torch.einsum("ij,jk->ik", x, y)


@case()
def where_clamp(x, y):
    return torch.where(x > 0, x, y).clamp(-0.5, 0.5)


@case()
def dropout_eval(x, y):
    return F.dropout(x, p=0.5, training=False) + y


@case()
def softmax_masked(x, y):
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


@case()
def sdpa(x, y):
    q = x.view(1, 1, 4, 4)
    return F.scaled_dot_product_attention(q, q, y.view(1, 1, 4, 4), is_causal=True)


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


# ---- modules -------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


_MLP = MLP()


@case(args=one)
def module_call(x):
    return _MLP(x)


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.scale + self.w


_WB = WithBuffers()


@case(args=one)
def module_buffers(x):
    return _WB(x)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.norms = nn.ModuleDict({"a": nn.LayerNorm(4), "b": nn.LayerNorm(4)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        x = self.norms["a"](x) + self.norms["b"](x)
        for name in self.norms:
            x = x + self.norms[name].weight
        return self.seq(x) + self.layers[-1](x) + len(self.layers)


_STACK = Stack()


@case(args=one)
def module_containers(x):
    return _STACK(x)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x)))).flatten(1)


_CONV = Conv().eval()


@case(args=lambda: (torch.randn(2, 3, 8, 8),))
def conv_module(x):
    return _CONV(x)


class TiedEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


_TIED = TiedEmbed()


@case(args=lambda: (torch.randint(0, 10, (2, 3)),))
def tied_weights(ids):
    return _TIED(ids)


class Attention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        att = att.softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, c))


_ATTN = Attention()


@case(args=lambda: (torch.randn(2, 5, 8),))
def attention_module(x):
    return _ATTN(x)


class FunctionalModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def helper(self, x):
        return x @ self.w

    def forward(self, x):
        return self.helper(x).tanh() + self.training


_FM = FunctionalModule().eval()


@case(args=one)
def module_methods(x):
    return _FM(x)


@case()
def autocast_block(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.mm(x, y)
    return z.float() + 1


class Scaled:
    def __init__(self, k):
        self.k = k
        self.entered = False

    def __enter__(self):
        self.entered = True
        return self.k

    def __exit__(self, *exc):
        self.entered = False
        return False


@case()
def user_context_manager(x, y):
    with Scaled(3) as k:
        z = x * k
    return z + y


@case()
def nullcontext_block(x, y):
    import contextlib
    with contextlib.nullcontext():
        z = x + y
    return z


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    @property
    def width(self):
        return self.proj.out_features // 2

    def forward(self, x):
        a, b = self.proj(x).split(self.width, dim=-1)
        out = a * torch.sigmoid(b)
        for name, block in self.blocks.items():
            out = out + block(x) * len(name)
        return out


_GATE = Gate()


@case(args=one)
def module_property_moduledict(x):
    return _GATE(x)


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


_RES = nn.Sequential(Residual(nn.Linear(4, 4)), Residual(nn.Sequential(nn.ReLU(), nn.Linear(4, 4))))


@case(args=one)
def nested_modules(x):
    return _RES(x)


@case(args=one)
def module_parameters_loop(x):
    total = x
    for p in _MLP.parameters():
        total = total + p.sum()
    return total


@case(args=one)
def module_named_children(x):
    for _name, child in _STACK.seq.named_children():
        if isinstance(child, nn.Linear):
            x = child(x)
    return x


@case()
def list_of_lists(x, y):
    grid = [[x, y], [y, x]]
    return sum(sum(row) for row in grid)


@case()
def dict_of_tuples(x, y):
    d = {"p": (x, 1), "q": (y, 2)}
    return sum(t * k for t, k in d.values())


@case()
def tensor_iteration(x, y):
    out = y[0]
    for row in x:
        out = out + row
    return out


@case()
def slice_assign_list(x, y):
    xs = [x, x, x]
    xs[1:] = [y, y]
    return sum(xs)


@case()
def bool_ops_on_python(x, y):
    flags = [True, False, True]
    n = sum(1 for f in flags if f)
    return x * n if any(flags) and not all(flags) else y


@case()
def math_functions(x, y):
    return x * math.cos(0.0) + y * math.exp(1.0) + math.ceil(1.2) + math.gcd(12, 8)


@case()
def divmod_pow(x, y):
    q, r = divmod(17, 5)
    return x * q + y * r + pow(2, 3)


@case()
def min_max_key(x, y):
    pairs = [(3, "c"), (1, "a"), (2, "b")]
    lo = min(pairs, key=lambda p: p[0])
    hi = max(pairs)
    return x * lo[0] + y * hi[0]


@case()
def enumerate_start(x, y):
    out = x
    for i, t in enumerate([x, y], start=5):
        out = out + t * i
    return out


@case()
def zip_three(x, y):
    out = x * 0
    for a, b, c in zip([x, y], [y, x], [1, 2]):
        out = out + a * b * c
    return out


@case()
def chained_methods(x, y):
    return x.abs().add(1).log().mul(y).sum(dim=1, keepdim=True).expand(4, 4).contiguous()


@case()
def inplace_python_list_of_tensors(x, y):
    acc = []
    for i in range(3):
        acc.append(x * i)
    acc[0] = y
    return torch.cat(acc, dim=0)


@case()
def keyword_only_torch(x, y):
    return torch.sum(x, dim=0, keepdim=True) + torch.nn.functional.normalize(y, p=2.0, dim=-1)


@case()
def torch_tensor_factory(x, y):
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    return x + t + torch.full((4,), 2.0) + torch.eye(4)


@case()
def type_conversion_methods(x, y):
    return x.int().float() + y.long().to(torch.float32) + x.half().float()


@case()
def masked_ops(x, y):
    m = x > 0
    return torch.where(m, x, torch.zeros_like(x)) + y.masked_fill(~m, 0.0)


@case()
def global_module_function(x, y):
    return F.relu(x) + torch.nn.functional.silu(y)


@case()
def class_attribute_read(x, y):
    return x * Affine.make(2).k + y


@case()
def nested_dict_access(x, y):
    cfg = {"model": {"scale": 2, "layers": [1, 2, 3]}}
    return x * cfg["model"]["scale"] + y * len(cfg["model"]["layers"])


# ---- graph breaks --------------------------------------------------------------------------
@case(graphs=2, breaks=1)
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
    print("kiln-corpus inner")
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
        print("kiln-corpus loop", i)
    return x * y


@case(graphs=2, breaks=1)
def break_in_no_grad(x, y):
    with torch.no_grad():
        a = x * 2
        print("kiln-corpus with")
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
    print("kiln-corpus locals")
    return d["x"] * k + len(names) + y


@case(graphs=1, breaks=1)  # nothing is computed before the break: no graph there
def break_then_loop(x, y):
    print("kiln-corpus before loop")
    for i in range(3):
        x = x + y * i
    return x


@case(graphs=1, breaks=1)
def break_at_start(x, y):
    print("kiln-corpus first")
    return x + y


@case(graphs=3, breaks=2)
def two_breaks(x, y):
    a = x + 1
    print("kiln-corpus one")
    b = a * y
    print("kiln-corpus two")
    return b - 1


@case(graphs=2, breaks=1)
def break_method_call(x, y):
    a = Affine(2)
    z = a.apply(x)
    print("kiln-corpus method")
    return z + a.k + y


@case(graphs=2, breaks=1)
def break_in_try(x, y):
    try:
        z = x + 1
        print("kiln-corpus try")
    except RuntimeError:
        z = x
    return z * y


@case(graphs=2, breaks=1)
def break_with_closure(x, y):
    k = 3

    def scale(t):
        return t * k
    a = scale(x)
    print("kiln-corpus closure")
    return scale(a) + y


@case(graphs=2, breaks=1)
def break_keyword_call(x, y):
    a = x + 1
    print("kiln-corpus", "kw", sep="-")
    return a * y
