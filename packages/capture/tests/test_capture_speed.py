"""What keeps a capture cheap (warm starts spend most of their time capturing): each a behaviour
check against eager plus a count of the work it saves."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln.capture as kc

from .conftest import assert_same


def _count_fake_ops(monkeypatch) -> list[str]:
    """Names of the aten ops dispatched to any FakeTensorMode from now on (outermost only)."""
    seen: list[str] = []
    real = FakeTensorMode.__torch_dispatch__
    depth = [0]

    def counting(self, func, types, args=(), kwargs=None):
        if depth[0] == 0:
            seen.append(str(func))
        depth[0] += 1
        try:
            return real(self, func, types, args, kwargs)
        finally:
            depth[0] -= 1
    monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", counting)
    return seen


def positions(x):
    pos = torch.arange(x.shape[-1], dtype=torch.float32)
    return x * pos + torch.zeros(x.shape[-1]) + torch.full((1,), 2.0)


def test_a_factory_call_runs_on_fake_tensors_once(recorder, monkeypatch):
    seen = _count_fake_ops(monkeypatch)
    g = kc.optimize(positions, recorder, fullgraph=True)
    x = torch.randn(3, 5)
    got = g(x)
    monkeypatch.undo()
    assert_same(got, positions(x))
    assert recorder.count == 1
    # arange, zeros, full: each probed once (no traced input) and that result recorded
    assert seen.count("aten.arange.start_step") + seen.count("aten.arange.default") == 1, seen
    assert seen.count("aten.zeros.default") + seen.count("aten.full.default") <= 2, seen
    gm = recorder.graphs[-1]
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.arange in targets and torch.zeros in targets and torch.full in targets
