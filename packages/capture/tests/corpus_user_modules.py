"""Corpus: the user's own nn.Module classes built inside compiled code (``Block(4)(x)`` in a forward).

Their ``__init__`` is inlined: the torch.nn submodules it builds, ``nn.Parameter(torch.randn(...))``,
buffers and ``self.apply(init_fn)`` are graph work drawing from torch's generator in eager's order
(``seeded``: both sides start from the same seed, every call draws new weights), its Python attributes
live on the trace's own object. A module that outlives the graph is built in Python (a break at the
user's construction).
"""

import torch
from torch import nn

from .corpus_registry import case, graph_break


def _x():
    return (torch.randn(3, 4),)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.scale = 0.5

    def forward(self, x):
        return self.ln(self.fc(x)) * self.scale + x


class Tanh2(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2


class Deep(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n):  # submodules built in a loop
            self.layers.append(Block(d))
        self.act = nn.Sequential(*[Tanh2() for _ in range(2)])

    @property
    def depth(self):
        return len(self.layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.act(x) / self.depth


class Projection(nn.Module):
    def __init__(self, d, k=3):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, k) * 0.1)
        self.b = nn.Parameter(torch.zeros(k))
        self.register_buffer("mask", torch.tril(torch.ones(k, k)))

    def forward(self, x):
        return (x @ self.w + self.b) @ self.mask


class Base(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.d = d
        self.inp = nn.Linear(d, 2 * d)


class Child(Base):
    def __init__(self, d):
        super().__init__(d)  # a super().__init__ chain through a user base class
        self.out = nn.Linear(2 * d, d)

    def forward(self, x):
        return self.out(torch.relu(self.inp(x))) + self.d


class Affine(nn.Module):
    def __init__(self, scale, d):
        super().__init__()
        self.scale = scale  # a tensor of the graph kept as a plain attribute
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.proj(x) * self.scale


class HFStyle(nn.Module):
    """transformers' pattern: ``self.apply(self._init_weights)`` re-initialises in place."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.emb = nn.Embedding(5, d)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            m.weight.data.normal_(mean=0.0, std=0.02)
            if m.bias is not None:
                m.bias.data.zero_()
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.5)

    def forward(self, x):
        return self.fc(x) + self.emb(torch.arange(x.shape[0])).sum(0)


class Gate(nn.Module):
    act = staticmethod(torch.sigmoid)

    def __init__(self, d, use_bias=True):
        super().__init__()
        self.g = nn.Linear(d, d, bias=use_bias)

    def forward(self, x):
        return x * self.act(self.g(x))


class Counted(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.sizes = list(sizes)
        self.blocks = nn.ModuleDict({f"b{i}": nn.Linear(s, s) for i, s in enumerate(sizes)})
        self.calls = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        for _, b in self.blocks.items():
            x = b(x)
        return x * len(self.calls)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_block(x):
    return Block(4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_deep_loop_and_property(x):
    return Deep(4, 2)(x)


@case(graphs=1, breaks=0, args=_x)
def umod_sequential_of_user_acts(x):
    return nn.Sequential(*[Tanh2() for _ in range(3)])(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_parameters_and_buffer(x):
    return Projection(4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_super_init_chain(x):
    return Child(4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_loss_backward_ready(x):
    m = Child(4)
    loss = m(x).pow(2).mean()
    return loss, loss.requires_grad


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_built_in_loop(x):
    for _ in range(3):
        x = Block(4)(x)
    return x


def _make_head(d, n):
    return nn.Sequential(Block(d), nn.Linear(d, n))


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_built_by_helper(x):
    return _make_head(4, 2)(x).softmax(-1)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_traced_constructor_args(x):
    return Affine(x.mean(), x.shape[-1])(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_apply_init_weights(x):
    return HFStyle(4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_dropout_then_eval(x):
    m = nn.Sequential(Block(4), nn.Dropout(0.5))
    return m(x), m.eval()(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_built_under_no_grad(x):
    with torch.no_grad():
        m = Block(4)
    return m(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_moduledict_and_python_state(x):
    m = Counted([4, 4])
    m(x)
    return m(x), m.calls


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_keyword_args_class_attr(x):
    return Gate(4, use_bias=False)(x) + Gate(d=4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_two_instances_distinct_weights(x):
    a, b = Block(4), Block(4)
    return b(a(x)), (a.fc.weight - b.fc.weight).abs().sum()


# ---- modules that outlive the graph: built in Python, a break at the user's construction ----------
@case(graphs=2, breaks=1, args=_x, seeded=True)
def umod_returned_is_real(x):
    m = Block(4)
    return m(x), m


@case(graphs=2, breaks=2, args=_x, seeded=True)
def umod_live_at_break(x):
    m = Block(4)
    graph_break()
    return m(x)


# ---- what the inlined __init__ meets: exceptions, a user __setattr__, classes defined inside, breaks ----
class _Raiser(nn.Module):
    def __init__(self, d):
        super().__init__()
        if d < 0:
            raise ValueError("kiln-corpus")
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(x)


class _Tracked(nn.Module):
    def __init__(self):
        super().__init__()
        self.names = []
        self.fc = nn.Linear(4, 4)

    def __setattr__(self, name, value):
        if name != "names" and "names" in self.__dict__:
            self.names.append(name)
        super().__setattr__(name, value)

    def forward(self, x):
        return self.fc(x), self.names


class _ItemInInit(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.k = int(t.sum().item() > 0) + 1  # a break inside __init__: the construction runs in Python
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * self.k


class _WithNew(nn.Module):
    def __new__(cls, *args):
        return super().__new__(cls)

    def forward(self, x):
        return x + 1


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_init_raises_caught(x):
    try:
        _Raiser(-1)
    except ValueError:
        pass
    return _Raiser(4)(x)


@case(graphs=1, breaks=0, args=_x, seeded=True)
def umod_user_setattr(x):
    return _Tracked()(x)


@case(graphs=1, breaks=0, args=_x)
def umod_class_defined_inside(x):
    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, y):
            return y * self.w
    return Local()(x)


@case(graphs=2, breaks=1, args=_x, seeded=True)
def umod_break_inside_init(x):
    return _ItemInInit(x)(x)


@case(graphs=2, breaks=1, args=_x)
def umod_with_new_breaks(x):
    return _WithNew()(x) * 2
