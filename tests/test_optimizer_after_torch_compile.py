"""torch.compile's first use marks every torch.optim optimizer's ``_init_group`` (and the fused update
functions) ``torch._dynamo.disable`` for its own tracer. kiln traces them as it does in a process where
torch.compile never ran: an Adam step compiled afterwards is one graph (it was a step run in Python, 7x
slower than the compiled one), equal to eager's step after step."""

from __future__ import annotations

import copy

import torch

import kiln


def test_an_optimizer_step_compiled_after_torch_compile_ran_is_still_one_graph():
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # torch.compile's first use patches torch.optim
    assert getattr(torch.optim.Adam._init_group, "_torchdynamo_disable", False)
    kiln.reset()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5)) for _ in range(4)]
    ref = copy.deepcopy(params)
    opt, ref_opt = torch.optim.Adam(params, lr=0.01, foreach=True), torch.optim.Adam(ref, lr=0.01, foreach=True)
    step = kiln.compile(opt.step)
    for _ in range(5):  # fresh gradients every step
        grads = [torch.randn(5) for _ in params]
        for p, q, g in zip(params, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref_opt.step()
        for p, q in zip(params, ref):
            torch.testing.assert_close(p, q)
    stats = kiln.stats()
    assert stats.graphs_compiled >= 1 and stats.frames_run_eagerly == 0, stats
