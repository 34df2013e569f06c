"""The corpus registry: a ``Case`` per program, filled by the ``corpus_*`` theme modules.

A case runs ``fn`` eagerly and through ``kiln.capture.optimize`` on the same inputs and compares
the results, the inputs afterwards (mutation), the number of graphs the backend received, and the
number of graph breaks ``explain`` reports. ``calls`` gives a sequence of argument factories, run
in order, for programs about guards and recompiles (``graphs`` then counts over the sequence).
``seeded`` programs draw from torch's generator (modules built with random weights inside): each
side runs right after the same ``torch.manual_seed``, and the generator must be left where eager
leaves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

import kiln.capture as kc


@dataclasses.dataclass
class Case:
    fn: Callable
    args: Callable[[], tuple]
    graphs: int
    breaks: int
    name: str
    kwargs: Callable[[], dict] = dict
    calls: tuple[Callable[[], tuple], ...] | None = None
    dynamic: bool | None = None
    recompiles: int | None = None
    seeded: bool = False


CASES: list[Case] = []


def two():
    return (torch.randn(4, 4), torch.randn(4, 4))


def one():
    return (torch.randn(4, 4),)


def case(graphs: int = 1, breaks: int = 0, args: Callable[[], tuple] = two, kwargs=dict,
         calls=None, dynamic=None, recompiles=None, seeded=False):
    def register(fn):
        if any(c.name == fn.__name__ for c in CASES):
            raise ValueError(f"two corpus programs are named {fn.__name__}")
        CASES.append(Case(fn, args, graphs, breaks, fn.__name__, kwargs,
                          tuple(calls) if calls is not None else None, dynamic, recompiles, seeded))
        return fn
    return register


@kc.disable(reason="the corpus's graph break")
def graph_break(*args, **kwargs):
    """A call capture never traces (``kiln.capture.disable``): the graph breaks around it, as at any
    construct capture cannot put in a graph. Returns None (``graph_break(...) or x`` is x)."""
    return None


def run_side(case: Case, fn: Callable, args: tuple, kwargs: dict, seed: int):
    """``fn(*args, **kwargs)``; for a seeded case, right after ``torch.manual_seed(seed)``, returning
    also the generator's next draw (so a compiled program must leave it where eager does)."""
    if not case.seeded:
        return fn(*args, **kwargs)
    torch.manual_seed(seed)
    out = fn(*args, **kwargs)
    return out, torch.rand(2)
