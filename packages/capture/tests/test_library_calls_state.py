"""Library functions and builtins given an object from outside the compiled code read its state
(``copy.copy``, ``copy.deepcopy``, ``dataclasses.asdict/replace/astuple``, ``vars``): such a call runs
at capture only once the object's whole state is guarded (its ``__dict__``, nested plain objects a
few levels deep), else it is inlined so what it reads is guarded, or breaks where it cannot be; one
call's state is never baked into the entry unguarded. Values changed between calls, fresh inputs,
compared with eager."""

import copy
import dataclasses

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder


@dataclasses.dataclass
class Cfg:
    scale: float = 1.0
    shift: int = 0


class Obj:
    def __init__(self):
        self.scale = 1.0


CFG, OBJ = Cfg(), Obj()

PROGRAMS = {
    "copy": lambda x: x * copy.copy(OBJ).scale,
    "deepcopy": lambda x: x * copy.deepcopy(CFG).scale + CFG.shift,
    "asdict": lambda x: x * dataclasses.asdict(CFG)["scale"],
    "replace": lambda x: x * dataclasses.replace(CFG, shift=1).scale,
    "astuple": lambda x: x + dataclasses.astuple(CFG)[1],
    "vars": lambda x: x * vars(OBJ)["scale"],
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_state_changed_between_calls(name):
    fn = PROGRAMS[name]
    kc.reset()
    opt = kc.optimize(fn, Recorder(), recompile_limit=20)
    for i in [0, 1, 2, 2, 3]:
        CFG.scale = OBJ.scale = float(i)
        CFG.shift = i
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), fn(x))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_one_graph_without_breaks(name):
    ex = kc.explain(PROGRAMS[name])(torch.randn(3))
    assert ex.graph_count == 1 and ex.break_count == 0, ex.as_text()


class Nested:
    def __init__(self):
        self.inner = Obj()
        self.items = [1, 2]


NESTED = Nested()


def test_nested_state_is_guarded():
    def f(x):
        return x * copy.deepcopy(NESTED).inner.scale + sum(copy.deepcopy(NESTED).items)
    kc.reset()
    opt = kc.optimize(f, Recorder(), recompile_limit=20)
    for i in range(4):
        NESTED.inner.scale = float(i)
        NESTED.items.append(i)
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), f(x))
