"""Corpus programs: breaks inside context managers, calls replayed after the graph (print, logging,
warnings, torch.manual_seed), modules built in compiled code, torch.compiler controls, and Python
constructs (functools, itertools, collections, dataclasses, enum, super(), properties, descriptors)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import itertools
import logging
import operator
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import kiln.capture as kc

from .corpus_registry import case, graph_break

_LOG = logging.getLogger("kiln.corpus")


# ---- breaks inside context managers resume inside them ----------------------------------------
@case(graphs=2, breaks=1)  # the block's end is in the second graph (torch.compile: 2 graphs, 1 break)
def ctx_break_inside_autocast(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ y
        graph_break()
        b = a @ y
    return b.float() + 1, a.dtype


@case(graphs=2, breaks=1)
def ctx_break_inside_autocast_disabled(x, y):
    with torch.autocast("cpu", enabled=False):
        a = x @ y
        graph_break()
        b = a * 2
    return b


@case(graphs=2, breaks=1)
def ctx_break_inside_no_grad_keeps_mode(x, y):
    with torch.no_grad():
        a = x * y
        graph_break()
        b = a + 1
        inside = torch.is_grad_enabled()
    return b, inside, torch.is_grad_enabled()


@case(graphs=1, breaks=1)  # nothing is computed before the break: no first graph
def ctx_break_inside_enable_grad(x, y):
    with torch.enable_grad():
        graph_break()
        b = x + y
    return b


class _Tracking:
    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


@case(graphs=2, breaks=1)
def ctx_break_inside_user_context(x, y):
    t = _Tracking()
    with t:
        a = x + 1
        graph_break()
        b = a * y
    return b, t.log


@contextlib.contextmanager
def _scaled(box):
    box.append("in")
    yield 2.0
    box.append("out")


@case(graphs=1, breaks=0)
def ctx_contextmanager_decorator(x, y):
    box = []
    with contextlib.nullcontext():
        z = x * y
    return z, box


@case(graphs=2, breaks=1)
def ctx_nested_autocast_no_grad(x, y):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ y
        graph_break()
        b = a @ y
    return b.float()


# ---- calls replayed after the graph ----------------------------------------------------------------
@case(graphs=1, breaks=0)
def deferred_print_tensor(x, y):
    z = x + y
    print("kiln-corpus z sum", z.sum())
    return z * 2


@case(graphs=1, breaks=0)
def deferred_print_kwargs(x, y):
    print("kiln-corpus", "a", "b", sep="-", end="\n")
    return x - y


@case(graphs=1, breaks=0)
def deferred_logging(x, y):
    _LOG.debug("kiln-corpus debug %s", x.shape)
    _LOG.info("kiln-corpus info")
    return x * y


@case(graphs=1, breaks=0)
def deferred_logging_module_function(x, y):
    logging.debug("kiln-corpus %d", 3)
    return x + 2 * y


@case(graphs=1, breaks=0)
def deferred_warning(x, y):
    warnings.warn("kiln-corpus warning", UserWarning, stacklevel=1)
    return x / (y.abs() + 1)


@case(graphs=1, breaks=0)
def deferred_manual_seed_no_random_after(x, y):
    torch.manual_seed(123)
    return x + y


@case(graphs=2, breaks=1)
def deferred_manual_seed_then_rand(x, y):
    torch.manual_seed(7)
    a = x + 1
    return a + torch.rand(4, 4), y


@case(graphs=1, breaks=0)
def deferred_rand_then_seed(x, y):
    r = torch.rand(4, 4)
    torch.manual_seed(11)
    return x + r * 0, y


@case(graphs=1, breaks=0)
def deferred_print_in_loop(x, y):
    for i in range(3):
        x = x + i
        print("kiln-corpus step", i)
    return x * y


# ---- modules built in compiled code -------------------------------------------------------------------
@case(graphs=1, breaks=0, args=lambda: (torch.randn(6, 5), torch.randint(0, 5, (6,))))
def module_cross_entropy_in_forward(logits, labels):
    return nn.CrossEntropyLoss()(logits, labels)


@case(graphs=1, breaks=0, args=lambda: (torch.randn(6, 5), torch.randint(0, 5, (6,))))
def module_loss_with_options(logits, labels):
    return nn.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1, reduction="sum")(logits, labels)


@case(graphs=1, breaks=0)
def module_mse_and_l1(x, y):
    return nn.MSELoss()(x, y) + nn.L1Loss(reduction="sum")(x, y)


@case(graphs=1, breaks=0)
def module_activations_built(x, y):
    return nn.ReLU()(x) + nn.GELU(approximate="tanh")(y) + nn.Softmax(dim=-1)(x)


@case(graphs=1, breaks=0)
def module_sequential_built(x, y):
    seq = nn.Sequential(nn.Tanh(), nn.Dropout(p=0.0), nn.Identity())
    return seq(x) * y


@case(graphs=2, breaks=1)
def module_with_weights_breaks(x, y):
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    return lin(x) + y


class _HFLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x, labels):
        logits = self.proj(x)
        loss = nn.CrossEntropyLoss()(logits.view(-1, 3), labels.view(-1))
        return loss, logits


_HF = _HFLike()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(5, 4), torch.randint(0, 3, (5,))))
def module_hf_style_loss(x, labels):
    return _HF(x, labels)


# ---- torch.compiler controls -------------------------------------------------------------------------
@torch.compiler.disable
def _torch_disabled(t):
    return t.sin()


@case(graphs=2, breaks=1)
def control_torch_disable(x, y):
    return _torch_disabled(x + 1) * y


def _allowed(t):
    return t * 3


kc.allow_in_graph(_allowed)


@case(graphs=1, breaks=0)
def control_allow_in_graph(x, y):
    return _allowed(x) + y


# ---- functools / itertools / operator ------------------------------------------------------------------
@case(graphs=1, breaks=0)
def py_functools_reduce_add(x, y):
    return functools.reduce(operator.add, [x, y, x * y])


@case(graphs=1, breaks=0)
def py_functools_partial_kw(x, y):
    scale = functools.partial(torch.mul, other=2.0)
    return scale(x) + y


@functools.cache
def _table(n):
    return tuple(range(n))


@case(graphs=1, breaks=0)
def py_itertools_islice_chain(x, y):
    parts = [t * 2 for t in itertools.islice(itertools.chain([x, y], [x + y]), 3)]
    return sum(parts)


@case(graphs=1, breaks=0)
def py_itertools_islice_chain_skip(x, y):
    parts = list(itertools.islice(itertools.chain([x, x + 1], [y * 3]), 1, None))
    return parts[0] + parts[1]


# accumulate and starmap call add/mul on the items from C, outside the trace: the break comes at the
# call making the iterator (found while iterating, it left the iterator consumed: an empty list); the
# resumed frame breaks again at iterating it
@case(graphs=2, breaks=2)
def py_itertools_accumulate_tensors(x, y):
    return torch.stack(list(itertools.accumulate([x, y, x * y]))) + len(list(itertools.accumulate([1, 2])))


@case(graphs=2, breaks=2)
def py_itertools_starmap_over_zip(x, y):
    return torch.stack(list(itertools.starmap(torch.mul, zip([x, y], [y, x + 1]))))


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        for p in itertools.islice(itertools.chain(self.a.parameters(), self.b.parameters()), 3):
            x = x + p.sum()
        return x


_TL = _TwoLinears()


@case(graphs=1, breaks=0, args=lambda: (torch.randn(4),))
def py_itertools_chain_parameters(x):
    return _TL(x)


@case(graphs=1, breaks=0)
def py_itertools_product_accumulate(x, y):
    total = x * 0
    for i, j in itertools.product(range(2), range(2)):
        total = total + (i + j) * y
    sums = list(itertools.accumulate([1, 2, 3]))
    return total, sums


@case(graphs=1, breaks=0)
def py_itertools_zip_longest_pairwise(x, y):
    acc = x
    for a, b in itertools.zip_longest([1, 2, 3], [4], fillvalue=0):
        acc = acc + a * b
    return acc * y


@case(graphs=1, breaks=0)
def py_operator_getters(x, y):
    pick = operator.itemgetter(1, 0)
    a, b = pick([x, y])
    return operator.mul(a, b)


# ---- collections ------------------------------------------------------------------------------------------
@case(graphs=1, breaks=0)
def py_collections_deque_local(x, y):
    d = collections.deque([x, y])
    d.appendleft(x * 2)
    return d.pop() + d.popleft()


@case(graphs=1, breaks=0)
def py_collections_counter_local(x, y):
    c = collections.Counter("abca")
    return x * c["a"] + y * len(c)


@case(graphs=1, breaks=0)
def py_collections_defaultdict_local(x, y):
    d = collections.defaultdict(list)
    d["t"].append(x)
    d["t"].append(y)
    return sum(d["t"])


_Pair = collections.namedtuple("_Pair", ["a", "b"])


@case(graphs=1, breaks=0)
def py_collections_namedtuple_replace(x, y):
    p = _Pair(x, y)._replace(b=y * 2)
    return p.a + p.b, p._fields


@case(graphs=1, breaks=0)
def py_collections_ordereddict_move(x, y):
    d = collections.OrderedDict(a=x, b=y)
    d.move_to_end("a")
    return list(d.values())[0] * 2


# ---- dataclasses and enums ----------------------------------------------------------------------------------
@dataclasses.dataclass
class _Cfg:
    scale: float = 2.0
    shift: float = 1.0


@case(graphs=1, breaks=0)
def py_dataclass_fields_replace(x, y):
    cfg = dataclasses.replace(_Cfg(), shift=3.0)
    return x * cfg.scale + cfg.shift + y


@dataclasses.dataclass(frozen=True)
class _Frozen:
    w: float


@case(graphs=1, breaks=0)
def py_dataclass_frozen_eq(x, y):
    same = _Frozen(1.0) == _Frozen(1.0)
    return x * _Frozen(0.5).w + y * same


class _Mode(enum.Enum):
    ADD = "add"
    MUL = "mul"


@case(graphs=1, breaks=0)
def py_enum_dispatch(x, y):
    out = x
    for m in _Mode:
        out = out + y if m is _Mode.ADD else out * y
    return out, _Mode("mul").name


class _Flag(enum.IntFlag):
    A = 1
    B = 2


@case(graphs=1, breaks=0)
def py_intflag(x, y):
    f = _Flag.A | _Flag.B
    return x * int(f) + y * (_Flag.B in f)


# ---- class hierarchies, super(), properties, descriptors --------------------------------------------------
class _Base:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        return t * self.k

    @property
    def twice(self):
        return self.k * 2


class _Mid(_Base):
    def apply(self, t):
        return super().apply(t) + 1


class _Leaf(_Mid):
    def __init__(self, k):
        super().__init__(k + 1)

    def apply(self, t):
        return super().apply(t) * 2


@case(graphs=1, breaks=0)
def py_super_chain(x, y):
    leaf = _Leaf(1)
    return leaf.apply(x) + y * leaf.twice


class _Positive:
    """A data descriptor clamping what is stored."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, owner=None):
        return getattr(obj, self.name)

    def __set__(self, obj, value):
        setattr(obj, self.name, max(value, 0.0))


class _WithDescriptor:
    rate = _Positive()

    def __init__(self, rate):
        self.rate = rate


@case(graphs=1, breaks=0)
def py_descriptor(x, y):
    d = _WithDescriptor(-1.0)
    e = _WithDescriptor(0.5)
    return x * d.rate + y * e.rate


class _Settable:
    def __init__(self):
        self._v = 1.0

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, value):
        self._v = value * 2


@case(graphs=1, breaks=0)
def py_property_setter(x, y):
    s = _Settable()
    s.v = 3.0
    return x * s.v + y


class _Counter:
    count = 0

    @classmethod
    def make(cls):
        return cls()

    @staticmethod
    def double(t):
        return t * 2


@case(graphs=1, breaks=0)
def py_classmethod_staticmethod(x, y):
    c = _Counter.make()
    return _Counter.double(x) + y * isinstance(c, _Counter)


class _Abstractish:
    def forward(self, t):
        raise NotImplementedError

    def __call__(self, t):
        return self.forward(t) + 1


class _Concrete(_Abstractish):
    def forward(self, t):
        return t.relu()


@case(graphs=1, breaks=0)
def py_template_method(x, y):
    return _Concrete()(x) * y


class _Slots:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


@case(graphs=1, breaks=0)
def py_slots_object(x, y):
    s = _Slots(x, y)
    return s.a * s.b


@case(graphs=1, breaks=0)
def py_functional_softmax_pipeline(x, y):
    steps = [functools.partial(F.softmax, dim=-1), torch.log, functools.partial(torch.mul, other=-1.0)]
    out = x
    for s in steps:
        out = s(out)
    return out + y
