"""The read tree of sources (``source_tree``) and guard plans built from it (``plan_check(tree=...)``)."""

from __future__ import annotations

import types

import torch

from kiln.graph import Guard, GuardSet, source_tree, tensor_expectation
from kiln.graph.guards_plan import plan_check


def _module():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    m.flag = True
    return m


def _guards(m):
    return [
        Guard("", "GLOBAL_STATE", __import__("kiln.graph", fromlist=["x"]).global_state()),
        Guard("L['x']", "TENSOR_MATCH", tensor_expectation(torch.zeros(2, 3))),
        Guard("L['self'].flag", "EQUALS_MATCH", True),
        Guard("L['self']._modules['0'].in_features", "EQUALS_MATCH", 3),
        Guard("L['self']._modules['2'].out_features", "EQUALS_MATCH", 2),
        Guard("L['self']._modules['0']._parameters['weight']", "TENSOR_MATCH",
              tensor_expectation(m[0].weight)),
        Guard("len(L['self']._modules)", "EQUALS_MATCH", 3),  # not a chain: a root row
    ]


def test_source_tree_lists_each_prefix_once_parents_first():
    tree = source_tree(["L['self']._modules['0'].weight", "L['self']._modules['0'].bias",
                        "L['self']._modules['1']", "len(L['self'])", "L['x']"])
    sources = [s for s, _, _ in tree]
    assert len(sources) == len(set(sources))
    assert sources[:4] == ["L['self']", "L['self']._modules", "L['self']._modules['0']",
                           "L['self']._modules['0'].weight"]
    for i, (source, parent, segment) in enumerate(tree):
        assert parent < i
        assert source == (segment if parent < 0 else tree[parent][0] + segment)
    assert ("len(L['self'])", -1, "len(L['self'])") in tree


def test_a_plan_from_the_tree_checks_and_gathers_as_one_without():
    m = _module()
    guards = _guards(m)
    outputs = ["L['x']", "L['self']._modules['0']._parameters['weight']",
               "L['self']._modules['2']._parameters['bias']"]
    tree = source_tree([*outputs, *(g.source for g in guards)])
    with_tree, without = plan_check(guards, outputs, tree), plan_check(guards, outputs)
    assert with_tree.__kiln_reads__ == without.__kiln_reads__  # the same reads, no extra node
    x = torch.randn(2, 3)
    got, want = with_tree({"self": m, "x": x}, {}), without({"self": m, "x": x}, {})
    assert got is not None and all(a is b for a, b in zip(got, want))
    m.flag = False
    assert with_tree({"self": m, "x": x}, {}) is None
    m.flag = True
    m[0].in_features = 5
    assert with_tree({"self": m, "x": x}, {}) is None
    assert with_tree({"self": _module(), "x": torch.randn(3, 3)}, {}) is None


def test_rows_no_guard_or_output_uses_are_not_read():
    """A tree may hold more sources than the plan checks (a load that rewrote some): those rows
    make no node, so a call never reads them (reading them could fail)."""
    m = _module()
    guards = [Guard("L['self'].flag", "EQUALS_MATCH", True)]
    tree = source_tree(["L['self'].flag", "L['self'].missing.deeper", "L['gone'].attr"])
    check = plan_check(guards, ["L['self'].flag"], tree)
    assert check.__kiln_reads__ == 2  # L['self'], .flag
    assert check({"self": m}, {}) == [True]


def test_compile_gather_takes_the_tree():
    m = _module()
    guards = GuardSet(tuple(_guards(m)))
    outputs = ["L['x']"]
    tree = source_tree([*outputs, *(g.source for g in guards)])
    x = torch.randn(2, 3)
    assert guards.compile_gather(outputs, tree)({"self": m, "x": x}, {})[0] is x
    ns = types.SimpleNamespace(flag=True)
    assert guards.compile_gather(outputs, tree)({"self": ns, "x": x}, {}) is None


def test_a_layout_as_json_builds_the_same_check():
    """``gather_layout`` -> JSON -> ``compile_layout``: the same reads, the same answers (passes,
    each kind of failure), no source split again."""
    import json

    m = _module()
    guards = GuardSet((*_guards(m), Guard("L['self']._modules['1']", "TYPE_MATCH",
                                          "torch.nn.modules.activation:ReLU"),
                       Guard("L['self']._modules['0'].bias", "NOT_NONE", None),
                       Guard("L['x'].size()[0]", "SYMBOL", "s0"),
                       Guard("L['self']._modules['0']._parameters['bias'].size()[0]", "SYMBOL", "s1"),
                       Guard("", "SHAPE_EXPR", "s0 >= 2")))
    outputs = ["L['x']", "L['self']._modules['0']._parameters['weight']"]
    layout = json.loads(json.dumps(guards.gather_layout(outputs)))
    rebuilt, direct = guards.compile_layout(layout), guards.compile_gather(outputs)
    assert rebuilt.__kiln_reads__ == direct.__kiln_reads__
    x = torch.randn(2, 3)
    for case in ({"self": m, "x": x}, {"self": m, "x": torch.randn(1, 3)}, {"self": m, "x": x.double()},
                 {"self": _module().double(), "x": x}, {"self": types.SimpleNamespace(), "x": x}):
        a, b = rebuilt(case, {}), direct(case, {})
        assert (a is None) == (b is None)
        if a is not None:
            assert all(u is v for u, v in zip(a, b))
    assert rebuilt({"self": m, "x": x}, {}) is not None


def test_a_layout_that_does_not_fit_raises():
    import pytest

    m = _module()
    guards = GuardSet(tuple(_guards(m)))
    layout = guards.gather_layout(["L['x']"])
    bad_parent = {**layout, "levels": [[[99], [0]], *layout["levels"][1:]]}
    with pytest.raises(ValueError):
        guards.compile_layout(bad_parent)
    bad_position = {**layout, "outputs": [10_000]}
    with pytest.raises(ValueError):
        guards.compile_layout(bad_position)
    with pytest.raises((ValueError, IndexError)):
        GuardSet(tuple(_guards(m))[:2]).compile_layout(layout)  # fewer guards than it indexes
