"""Smoke test of kiln-inductor installed alone (with kiln-graph, kiln-decomp, kiln-runtime)."""

import torch
from torch import fx

import kiln.inductor as inductor

aten = torch.ops.aten
g = fx.Graph()
x = g.placeholder("x")
y = g.call_function(aten.mul.Tensor, (g.call_function(aten.exp.default, (x,)), 2.0))
s = g.call_function(aten.sum.dim_IntList, (y, [1]))
g.output((y, s))
gm = fx.GraphModule(torch.nn.Module(), g)
inp = torch.randn(8, 32)
compiled = inductor.compile_graph(gm, [inp])
out = compiled(inp)
torch.testing.assert_close(out[0], inp.exp() * 2)
torch.testing.assert_close(out[1], (inp.exp() * 2).sum(1))
print("kiln-inductor alone: ok")
