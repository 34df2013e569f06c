"""Module containers that change between calls, and recurrent modules trained inside compiled code,
called again and again against eager.

Before: a layer appended to an ``nn.ModuleList`` after the first call was never run (iterating the list
read its length once, unguarded), and the training step of an ``nn.LSTM``/``nn.GRU`` on the CPU failed
in its backward (aot_eager: "Expected a proper Tensor but got None for argument 'workspace'") or crashed
the process (inductor: a segmentation fault in the compiled backward). And a module's backward hooks
(``register_full_backward_hook``, its pre-hook form, the global one) never fired: traced into a graph,
or run around the compiled module's forward without nn.Module's own call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln

BACKENDS = ["aot_eager", "inductor"]


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x + self.layers[-1].bias


class _Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2)})

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads.values()], dim=-1) + len(self.heads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [_Stack, _Heads], ids=["ModuleList", "ModuleDict"])
def test_members_added_after_a_call_are_run(backend, make):
    kiln.reset()
    torch.manual_seed(0)
    m = make()
    compiled = kiln.compile(m, backend=backend)
    for i in range(4):
        if i:
            torch.manual_seed(i)
            if isinstance(m, _Stack):
                m.layers.append(nn.Linear(4, 4))
            else:
                m.heads[f"h{i}"] = nn.Linear(4, 3)
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), m(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_recurrent_module_trains_as_in_eager(backend, kind):
    def make():
        torch.manual_seed(0)
        cls = nn.LSTM if kind == "LSTM" else nn.GRU
        return cls(4, 5, num_layers=2, batch_first=True, bidirectional=kind == "GRU")

    kiln.reset()
    ref, mine = make(), make()
    compiled = kiln.compile(mine, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 3, 4)
        got, want = compiled(x)[0], ref(x)[0]
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for a, b in zip(mine.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        mine.zero_grad()
        ref.zero_grad()


def test_a_recurrent_module_in_inference_is_compiled():
    kiln.reset()
    kiln.stats_reset()
    torch.manual_seed(0)
    m = nn.LSTM(4, 5, batch_first=True).eval()
    compiled = kiln.compile(m)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 4)
            torch.testing.assert_close(compiled(x)[0], m(x)[0])
    assert kiln.stats().graphs_compiled >= 1 and kiln.stats().graph_breaks == 0, kiln.stats()


def _seq() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["full", "pre", "global"])
def test_backward_hooks_of_a_submodule_fire_as_in_eager(backend, kind):
    """A backward hook hangs on autograd nodes of the call's tensors, which a graph does not make:
    traced, the hook never fired (silently). The hooked call runs in Python now (its forward compiled)."""
    seen: dict[str, list[torch.Tensor]] = {"ref": [], "mine": []}

    def hook_for(key):
        if kind == "pre":
            return lambda mod, grad_out: seen[key].append(grad_out[0].clone())
        return lambda mod, grad_in, grad_out: seen[key].append(grad_out[0].clone())

    kiln.reset()
    ref, mine = _seq(), _seq()
    compiled = kiln.compile(mine, backend=backend)
    handles = []
    try:
        for i in range(3):
            if i == 1:  # registered after the first call: seen on the next one
                for key, m in (("ref", ref), ("mine", mine)):
                    if kind == "full":
                        handles.append(m[2].register_full_backward_hook(hook_for(key)))
                    elif kind == "pre":
                        handles.append(m[2].register_full_backward_pre_hook(hook_for(key)))
                if kind == "global":
                    handles.append(nn.modules.module.register_module_full_backward_hook(
                        lambda mod, gi, go: seen["ref" if any(mod is s for s in ref.modules()) else "mine"].append(
                            go[0].clone())))
            x = torch.randn(5, 4)
            compiled(x).square().sum().backward()
            ref(x).square().sum().backward()
            assert len(seen["mine"]) == len(seen["ref"]) > 0 or i == 0
            for a, b in zip(seen["mine"], seen["ref"]):
                torch.testing.assert_close(a, b)
            for a, b in zip(mine.parameters(), ref.parameters()):
                torch.testing.assert_close(a.grad, b.grad)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_hook_of_the_compiled_module_itself_fires(backend):
    kiln.reset()
    ref, mine = _seq(), _seq()
    compiled = kiln.compile(mine, backend=backend)
    seen: dict[str, list[torch.Tensor]] = {"ref": [], "mine": []}
    x = torch.randn(5, 4)
    compiled(x).sum().backward()  # compiled before the hook exists
    handles = [m.register_full_backward_hook(lambda mod, gi, go, k=k: seen[k].append(go[0].clone()))
               for k, m in (("ref", ref), ("mine", mine))]
    try:
        for _ in range(2):
            x = torch.randn(5, 4, requires_grad=True)
            compiled(x).square().sum().backward()
            ref(x.detach().requires_grad_()).square().sum().backward()
        assert len(seen["mine"]) == len(seen["ref"]) == 2
        for a, b in zip(seen["mine"], seen["ref"]):
            torch.testing.assert_close(a, b)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_kiln_autograd_cannot_trace_runs_op_by_op_on_every_backend(backend):
    """``nn.Embedding(max_norm=...)`` renormalises its weight in place inside the forward, which
    kiln.autograd does not trace for a weight that requires grad: both backends run that graph op by op
    with torch's autograd and count it (aot_eager raised where eager ran)."""
    def make():
        torch.manual_seed(0)
        return nn.Embedding(10, 4, max_norm=1.0)

    kiln.reset()
    kiln.stats_reset()
    ref, mine = make(), make()
    compiled = kiln.compile(mine, backend=backend)
    for _ in range(3):
        idx = torch.randint(0, 10, (6,))
        got, want = compiled(idx), ref(idx)
        got.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine.weight, ref.weight)
        torch.testing.assert_close(mine.weight.grad, ref.weight.grad)
    assert kiln.stats().graphs_run_eagerly >= 1, kiln.stats()
