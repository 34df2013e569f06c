"""Minimum s-t cut on a small flow network (Dinic's max-flow), for the min-cut partitioner.

Why not networkx: building its residual network (dicts of edge-attribute dicts) and running
preflow-push cost 0.3-1 s per training graph; this is plain lists of ints.

The cut returned is the one networkx's ``minimum_cut`` returns: the sink side is every node that can
still reach the sink in the residual network of a maximum flow. That set is the same for every
maximum flow (it is the smallest sink side of any minimum cut), so the partition does not depend on
which augmenting paths were found.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

INFINITE = None  # the capacity of an edge that can never be cut


class CutNetwork:
    """A directed graph with integer (or infinite) edge capacities."""

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._names: list[Hashable] = []
        self._adj: list[list[int]] = []  # node -> its edge ids (forward and residual twins)
        self._to: list[int] = []
        self._cap: list[int | None] = []  # edge e's twin is e ^ 1; None: infinite (resolved in cut)
        self._edges: dict[tuple[int, int], int] = {}

    def node(self, name: Hashable) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self._names)
            self._names.append(name)
            self._adj.append([])
        return i

    def add_edge(self, u: Hashable, v: Hashable, capacity: int | None = INFINITE) -> None:
        """An edge ``u -> v``; adding it again sets its capacity when one is given (as a networkx
        DiGraph's ``add_edge`` updates the edge's attributes)."""
        a, b = self.node(u), self.node(v)
        if (a, b) in self._edges:
            if capacity is not INFINITE:
                self._cap[self._edges[(a, b)]] = capacity
            return
        self._edges[(a, b)] = len(self._to)
        self._adj[a].append(len(self._to))
        self._to.append(b)
        self._cap.append(capacity)
        self._adj[b].append(len(self._to))
        self._to.append(a)
        self._cap.append(0)

    def source_side(self, source: Hashable, sink: Hashable) -> set[Hashable]:
        """The nodes that cannot reach ``sink`` after a maximum flow from ``source``."""
        s, t = self.node(source), self.node(sink)
        finite = sum(c for c in self._cap if c is not None)
        inf = 2 * finite + 1  # larger than any cut of finite edges
        cap = [inf if c is None else c for c in self._cap]
        flow = _max_flow(self._adj, self._to, cap, s, t)
        if flow >= inf:
            raise ValueError("the flow network has a path of uncuttable edges from source to sink")
        reaches_sink = _reaching(self._adj, self._to, cap, t)
        return {name for i, name in enumerate(self._names) if not reaches_sink[i]}


def _levels(adj: list[list[int]], to: list[int], cap: list[int], s: int) -> list[int]:
    level = [-1] * len(adj)
    level[s] = 0
    todo = deque([s])
    while todo:
        u = todo.popleft()
        for e in adj[u]:
            v = to[e]
            if cap[e] > 0 and level[v] < 0:
                level[v] = level[u] + 1
                todo.append(v)
    return level


def _max_flow(adj: list[list[int]], to: list[int], cap: list[int], s: int, t: int) -> int:
    """Dinic: blocking flows on BFS level graphs; ``cap`` becomes the residual capacities."""
    total = 0
    while True:
        level = _levels(adj, to, cap, s)
        if level[t] < 0:
            return total
        nxt = [0] * len(adj)  # per node: the first edge not known to be useless in this phase
        while True:
            pushed = _augment(adj, to, cap, level, nxt, s, t)
            if not pushed:
                break
            total += pushed


def _augment(adj: list[list[int]], to: list[int], cap: list[int], level: list[int], nxt: list[int],
             s: int, t: int) -> int:
    """One augmenting path along the level graph (iterative DFS); 0 when there is none left."""
    path: list[int] = []
    u = s
    while True:
        if u == t:
            pushed = min(cap[e] for e in path)
            for e in path:
                cap[e] -= pushed
                cap[e ^ 1] += pushed
            return pushed
        edges = adj[u]
        i = nxt[u]
        while i < len(edges):
            e = edges[i]
            if cap[e] > 0 and level[to[e]] == level[u] + 1:
                break
            i += 1
        nxt[u] = i
        if i < len(edges):
            path.append(edges[i])
            u = to[edges[i]]
            continue
        if not path:
            return 0
        level[u] = -1  # a dead end: never entered again in this phase
        e = path.pop()
        u = to[e ^ 1]
        nxt[u] += 1


def _reaching(adj: list[list[int]], to: list[int], cap: list[int], t: int) -> list[bool]:
    """Per node: whether it reaches ``t`` through edges with residual capacity left."""
    seen = [False] * len(adj)
    seen[t] = True
    todo = [t]
    while todo:
        v = todo.pop()
        for e in adj[v]:  # e: v -> u; its twin e ^ 1 is u -> v
            u = to[e]
            if not seen[u] and cap[e ^ 1] > 0:
                seen[u] = True
                todo.append(u)
    return seen
