"""kiln.compile checks its entries' guards with the native checker (kiln.runtime.native_guards), and a
compiled module whose Python state, inputs and parameters change between calls still answers as eager
on every call: each change recompiles or hits the entry it matches, never a stale one."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import kiln
from kiln.graph import guards_native
from kiln.runtime import native_guards


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.scale = 2.0
        self.mode = "relu"
        self.extra: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.scale
        y = torch.relu(y) if self.mode == "relu" else torch.tanh(y)
        if self.extra is not None:
            y = y + self.extra
        return y


def _entries() -> list:
    from kiln.capture.optimize import _ALL_CONTEXTS
    return [e for ctx in _ALL_CONTEXTS for cache in ctx.caches.values() for e in cache.entries]


def test_compiled_entries_check_natively_and_every_change_answers_as_eager() -> None:
    kiln.reset()
    torch.manual_seed(0)
    m = Scaled().eval()
    f = kiln.compile(m)
    assert native_guards.install() and guards_native.installed(), native_guards.reason()

    def same(x: torch.Tensor) -> None:
        with torch.no_grad():
            torch.testing.assert_close(f(x), m(x))

    for _ in range(3):
        same(torch.randn(3, 6))
    entry = _entries()[-1]
    native = entry.guards.compile()
    assert type(native).__name__ == "Program" or hasattr(native, "__kiln_native__")
    changes = [
        lambda: setattr(m, "mode", "tanh"),  # a string attribute the trace branched on
        lambda: setattr(m, "scale", 0.5),  # a float attribute (symbolic after it changes)
        lambda: setattr(m, "extra", torch.randn(4)),  # None -> a tensor
        lambda: m.lin.weight.data.mul_(3.0),  # the parameter's values (no recompile needed)
        lambda: setattr(m, "lin", nn.Linear(6, 4)),  # a new submodule
        lambda: setattr(m, "extra", None),
    ]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for change in changes:
            change()
            for _ in range(3):  # fresh inputs each call
                same(torch.randn(3, 6))
        same(torch.randn(6, 3).t())  # another stride
    assert not [w for w in seen if "EAGERLY" in str(w.message)]  # every call above ran compiled code
