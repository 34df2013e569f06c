"""Smoke test of kiln-capture installed alone (with kiln-graph): capture-only, no code generator."""

import torch

import kiln.capture as capture

graphs = []


def backend(gm, example_inputs):
    graphs.append(gm)
    return gm.forward


def f(x, y):
    z = torch.relu(x) + y
    print("a graph break")
    return z * 2


opt = capture.optimize(f, backend)
x, y = torch.randn(4), torch.randn(4)
torch.testing.assert_close(opt(x, y), f(x, y))
assert len(graphs) == 2, graphs
report = capture.explain(f)(x, y)
assert report.break_count == 1
print("kiln-capture alone: ok")
