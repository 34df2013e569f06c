"""Recompiles on sizes: automatic dynamic dims and ints (arguments and attributes), the recompile
limit's warning (which guard kept failing, what to do), shape guards a backend adds after capture,
and symbolic guards printed readably in explain() and the recompiles log."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch
from torch import nn

import kiln.capture as kc
from kiln.graph import set_logs

from .conftest import assert_same


def test_size_stream_compiles_twice(recorder):
    def f(x):
        return x.relu() * x.shape[0]
    g = kc.optimize(f, recorder)
    for n in range(2, 30):
        x = torch.randn(n, 3)
        assert_same(g(x), f(x))
    assert recorder.count == 2  # the first size, then one symbolic graph for every other size


class Step(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.pos


def test_attribute_int_that_varies_becomes_symbolic(recorder):
    m = Step()
    g = kc.optimize(m.forward, recorder)
    for pos in range(2, 14):
        m.pos = pos
        x = torch.randn(2, 4)
        assert_same(g(x), m(x))
    assert recorder.count == 2
    assert any(isinstance(n.meta.get("val"), torch.SymInt)
               for n in recorder.graphs[-1].graph.nodes if n.op == "placeholder")


def test_recompile_limit_warning_names_the_guard_and_what_to_do(recorder):
    def f(x):
        return x + 1
    g = kc.optimize(f, recorder, dynamic=False, recompile_limit=3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(2, 9):
            x = torch.randn(n)
            assert_same(g(x), f(x))
    assert recorder.count == 3
    msg = " ".join(str(m.message) for m in w if "recompile limit" in str(m.message))
    assert "EAGERLY" in msg
    assert "TENSOR_MATCH on L['x']" in msg and "kept failing (3 of 3 misses)" in msg
    assert "kiln.mark_dynamic" in msg and "dynamic=True" in msg


def _specialising(gm, example_inputs):
    """A backend that reads each symbolic size as an int (a compiler that specialises)."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            [int(s) for s in v.shape]  # noqa: B018 - the int() adds a guard s == value
    return gm.forward


def test_backend_specialisation_is_guarded_and_reported():
    kc.reset()

    def f(x):
        return x * 2
    g = kc.optimize(f, _specialising, recompile_limit=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(2, 12):  # fresh inputs each call: a graph for another size is never reused
            x = torch.randn(n)
            assert_same(g(x), f(x))
    entries = kc.cache_entries(g)
    assert len(entries) == 4
    # the symbolic entries carry the backend's assumption as a guard, never serve another size
    assert any(re.search(r"\(s\d+ == \d+\)", e.guards.as_text()) for e in entries[1:])
    msg = " ".join(str(m.message) for m in w if "recompile limit" in str(m.message))
    assert re.search(r"size guards on L\['x'\]\.size\(\)\[0\]", msg), msg
    assert "specialised to one size" in msg


def test_explain_prints_symbolic_guards_readably():
    def f(x, y):
        return torch.cat([x, y]).reshape(-1, 2)
    x, y = torch.randn(4, 3), torch.randn(6, 3)
    kc.mark_dynamic(x, 0)
    kc.mark_dynamic(y, 0)
    text = kc.explain(f)(x, y).guards[0].as_text()
    assert re.search(r"SYMBOL +s\d+ := L\['x'\]\.size\(\)\[0\]", text), text
    assert re.search(r"SHAPE_EXPR +s\d+ >= 1  # size range", text), text


def test_recompiles_log_names_the_failing_size_guard(recorder, caplog):
    def f(x):
        if x.shape[0] > 5:
            return x * 2
        return x - 1
    set_logs("recompiles")
    try:
        logging.getLogger("kiln.recompiles").propagate = True
        with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            g = kc.optimize(f, recorder, dynamic=True)
            for n in (8, 9, 3, 4):
                x = torch.randn(n)
                assert_same(g(x), f(x))
    finally:
        set_logs()
    assert recorder.count == 2
    assert re.search(r"size guard \(s\d+ > 5\)|size guard \(5 < s\d+\)|size guard s\d+ >= 6", caplog.text), caplog.text


def test_recompile_reason_shows_what_the_guard_compares_in_a_line(recorder, caplog):
    """An optimizer's state dict gained its 32 entries after the first step: the reason says how many keys
    and what they are, not the whole state printed (it was pages of tensor values)."""
    params = [torch.randn(16, requires_grad=True) for _ in range(32)]
    state: dict = {}

    def step(state, params):
        for p in params:
            if p not in state:
                state[p] = torch.zeros_like(p)
        return sum(s.sum() for s in state.values())

    set_logs("recompiles")
    try:
        logging.getLogger("kiln.recompiles").propagate = True
        with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            g = kc.optimize(step, recorder)
            g(state, params)
            g(state, params)
    finally:
        set_logs()
    reasons = [r.getMessage() for r in caplog.records if "guard failed" in r.getMessage()]
    assert reasons, caplog.text
    assert all(len(r) < 700 for r in reasons), reasons
    assert any("32 key(s) (tensor(float32, (16,), cpu)" in r for r in reasons), reasons


@pytest.mark.parametrize("dynamic", [None, True])
def test_marked_range_bounds_the_symbolic_entry(recorder, dynamic):
    def f(x):
        return x.sum(0)
    g = kc.optimize(f, recorder, dynamic=dynamic)
    x = torch.randn(5, 2)
    kc.mark_dynamic(x, 0, min=4, max=6)
    for t in (x, torch.randn(4, 2), torch.randn(6, 2), torch.randn(7, 2), torch.randn(9, 2)):
        assert_same(g(t), f(t))
    assert recorder.count == 2  # 4..6 from the marked entry; 7 and 9 share a second one
    with pytest.raises(kc.Unsupported, match=r"outside the range \[4, 6\]"):
        y = torch.randn(3, 2)
        kc.mark_dynamic(y, 0, min=4, max=6)
        kc.optimize(f, recorder)(y)


class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_nested_tensor_that_changes_size_recompiles_once(recorder):
    def f(h):
        return h.t.cumsum(0) * 2
    g = kc.optimize(f, recorder)
    for n in range(2, 12):
        h = Holder(torch.randn(n, 3))
        assert_same(g(h), f(h))
    assert recorder.count == 2  # the first size, then one symbolic graph (found while tracing)


def _symbolic_dims(gm: torch.fx.GraphModule) -> list[tuple[bool, ...]]:
    return [tuple(isinstance(s, torch.SymInt) for s in n.meta["val"].shape) for n in gm.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]


def test_leading_dim_turns_symbolic_with_the_first_change(recorder):
    """[batch, seq] token ids: the first recompile (sequence changed) makes batch symbolic too, so a
    later batch size takes no further graph."""
    def f(ids):
        return (ids * 3).sum(-1)
    g = kc.optimize(f, recorder)
    for b, s in ((7, 56), (7, 10), (5, 40), (8, 33), (2, 9)):
        ids = torch.randint(0, 100, (b, s))
        assert_same(g(ids), f(ids))
    assert recorder.count == 2
    assert _symbolic_dims(recorder.graphs[-1]) == [(True, True)]


@pytest.mark.parametrize("shapes,expected", [
    (((8, 3, 4), (3, 3, 4)), (True, False, False)),  # a partial last batch: only the batch
    (((1, 6), (1, 9)), (False, True)),  # a leading 1 stays static (0/1 specialise)
    (((6,), (9,)), (True,)),
])
def test_leading_dim_rule_leaves_other_dims_alone(recorder, shapes, expected):
    def f(x):
        return x.relu() + 1
    g = kc.optimize(f, recorder)
    for shape in shapes:
        x = torch.randn(shape)
        assert_same(g(x), f(x))
    assert recorder.count == 2
    assert _symbolic_dims(recorder.graphs[-1]) == [expected]


def test_mark_static_keeps_the_leading_dim_static(recorder):
    def f(x):
        return x * 2
    g = kc.optimize(f, recorder)
    for s in (5, 9, 12):
        x = torch.randn(4, s)
        kc.mark_static(x, 0)
        assert_same(g(x), f(x))
    assert _symbolic_dims(recorder.graphs[-1]) == [(False, True)]


def test_a_marked_dim_that_varies_leaves_the_leading_dim_alone(recorder):
    def f(x, k):
        return x * k
    g = kc.optimize(f, recorder)
    for s, k in ((5, 2.0), (9, 3.0), (12, 4.0)):  # k changes: a recompile that reads x's sizes again
        x = torch.randn(4, s)
        kc.mark_dynamic(x, 1)
        assert_same(g(x, k), f(x, k))
    assert _symbolic_dims(recorder.graphs[-1]) == [(False, True)]


def _by_number_type(x, n, s):
    a = x + n if isinstance(n, int) else x - 100
    b = x * s if isinstance(s, float) and not isinstance(s, int) else x - 100
    return a, b, type(n) is int, type(s).__name__


def test_a_dynamic_number_is_still_an_int_or_a_float(recorder):
    """isinstance/type of an int or float argument that became a symbol (its second value) answer as
    for the caller's number. Before, ``isinstance(n, int)`` on the SymInt was False: from the second
    call on, the graph took the other branch."""
    g = kc.optimize(_by_number_type, recorder)
    for n, s in [(1, 0.5), (2, 1.5), (3, 2.5), (7, 3.5)]:
        x = torch.randn(3)
        assert_same(g(x, n, s), _by_number_type(x, n, s))


def _shifted(x, n):
    return x.roll(n, 0) * n + (x[:n].sum() if n > 0 else x.sum())


@pytest.mark.parametrize("dynamic", [True, None])
def test_negative_int_argument_is_a_constant(recorder, dynamic):
    """An int argument that becomes a (positive) size symbol, then comes negative: ShapeEnv refused a
    positive symbol for -1 (AssertionError, the frame ran eagerly for good); a negative int is now a
    constant of its own entry, and the non-negative ones keep the symbolic graph."""
    g = kc.optimize(_shifted, recorder, dynamic=dynamic)
    for n in [2, 3, -1, -2, 4, 0, -5, 1, 5]:
        x = torch.randn(5)
        assert_same(g(x, n), _shifted(x, n))
    assert recorder.count >= 4  # the symbolic graph, and a constant one per negative value


def _size_keyed_cache():
    cache, seen = {}, set()

    def f(x):
        n = x.shape[0]
        if n not in cache:
            cache[n] = torch.arange(n).float()
        seen.add(n)
        return x + cache[n] + len(seen) + cache.get(n + 100, 0) + {(n, 1): 5}.get((n, 1), 0)
    return f


def test_symbolic_size_as_a_dict_or_set_key(recorder):
    """A symbolic size used as a key (``n in cache``, ``cache[n] = ...``, ``seen.add(n)``, a dict
    display) is specialised to its value: a SymInt does not hash (TypeError, and the frame ran eagerly
    for good)."""
    eager, traced = _size_keyed_cache(), _size_keyed_cache()
    g = kc.optimize(traced, recorder, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager fallback warns
        for n in [3, 4, 3, 5, 6, 4, 7]:
            x = torch.randn(n)
            assert_same(g(x), eager(x))
    assert recorder.count >= 1
