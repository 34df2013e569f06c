"""The min-cut partitioner's own max-flow (mincut.py) cuts where networkx's minimum_cut does."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from kiln.autograd.mincut import CutNetwork


def _random_network(seed: int) -> list[tuple[str, str, int | None]]:
    rng = random.Random(seed)
    n = rng.randint(4, 40)
    edges = []
    for _ in range(rng.randint(n, 4 * n)):
        u, v = rng.randrange(n), rng.randrange(n)
        if u == v:
            continue
        # few distinct capacities: many ties, where cuts could differ if the rule were loose
        cap = None if rng.random() < 0.2 else rng.choice([0, 1, 2, 3, 5])
        edges.append((f"n{u}", f"n{v}", cap))
    edges += [("source", "n0", None), (f"n{n - 1}", "sink", None)]
    for _ in range(3):
        edges.append(("source", f"n{rng.randrange(n)}", rng.choice([None, 4])))
        edges.append((f"n{rng.randrange(n)}", "sink", rng.choice([None, 4])))
    return edges


@pytest.mark.parametrize("seed", range(300))
def test_same_cut_as_networkx(seed: int) -> None:
    edges = _random_network(seed)
    ref = nx.DiGraph()
    ours = CutNetwork()
    for u, v, cap in edges:
        if cap is None:
            ref.add_edge(u, v)
        else:
            ref.add_edge(u, v, capacity=cap)
        ours.add_edge(u, v, cap)
    try:
        value, (reachable, _) = nx.minimum_cut(ref, "source", "sink")
    except nx.NetworkXUnbounded:
        with pytest.raises(ValueError, match="uncuttable"):
            ours.source_side("source", "sink")
        return
    assert ours.source_side("source", "sink") == reachable


def test_chain_with_a_cheap_middle_edge() -> None:
    net = CutNetwork()
    for u, v, c in [("source", "a", None), ("a", "b", 10), ("b", "c", 1), ("c", "d", 10), ("d", "sink", None)]:
        net.add_edge(u, v, c)
    assert net.source_side("source", "sink") == {"source", "a", "b"}
