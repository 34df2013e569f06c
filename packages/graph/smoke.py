"""Smoke test of kiln-graph installed alone (nox -s standalone)."""

import torch
from torch import fx

import kiln.graph as g

gm = fx.symbolic_trace(lambda x: torch.relu(x) * 2)
g.verify(gm, "torch")
guards = g.GuardSet((g.Guard("L['x']", "TENSOR_MATCH", g.tensor_expectation(torch.ones(2))),))
assert guards.compile()({"x": torch.ones(2)}, {})
print("kiln-graph alone: ok")
