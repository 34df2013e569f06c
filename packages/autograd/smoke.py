"""Smoke test of kiln-autograd installed alone (with kiln-graph and kiln-decomp)."""

import torch
from torch import fx, nn

import kiln.autograd as autograd

model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
gm = fx.symbolic_trace(lambda x, w1, b1, w2, b2: torch.tanh(x @ w1.t() + b1) @ w2.t() + b2)
params = [p.detach().clone().requires_grad_() for p in model.parameters()]
x = torch.randn(5, 4)
compiled = autograd.aot_eager(gm, [x, *params])
out = compiled(x, *params)
out[0].sum().backward() if isinstance(out, (tuple, list)) else out.sum().backward()
ref = model(x)
ref.sum().backward()
for p, q in zip(params, model.parameters()):
    torch.testing.assert_close(p.grad, q.grad)
print("kiln-autograd alone: ok")
