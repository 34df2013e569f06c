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
