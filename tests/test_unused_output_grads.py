"""A parameter that only feeds an output the loss does not use gets no gradient (None), as in eager.

Eager autograd never reaches it. A compiled backward computes a gradient for every parameter of the
graph; from undefined tangents that gradient is zero, and a zero gradient is not harmless: SGD with
momentum and AdamW's weight decay still move the parameter. (torch.compile returns the zeros.)
"""

from __future__ import annotations

import torch
from torch import nn

import kiln


class TwoHeads(nn.Module):
    """Inception-v3's shape: a main head and an auxiliary head the loss may leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.main = nn.Linear(8, 3)
        self.aux = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x).relu()
        return self.main(h), self.aux(h)


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def _step(fn, model: nn.Module, x: torch.Tensor, use_aux: bool) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    main, aux = fn(x)
    (main.square().mean() + (aux.sum() if use_aux else 0)).backward()
    return _grads(model)


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        if want[name] is None:
            assert got[name] is None, f"{name}: eager has no gradient, kiln gave {got[name]}"
        else:
            assert got[name] is not None, name
            torch.testing.assert_close(got[name], want[name])


def test_unused_head_has_no_gradient_like_eager() -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(5, 8)
    compiled = kiln.compile(model)
    _same(_step(compiled, model, x, use_aux=False), _step(model, model, x, use_aux=False))
    _same(_step(compiled, model, x, use_aux=True), _step(model, model, x, use_aux=True))  # same graph


def test_unused_head_has_no_gradient_after_load(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(5, 8)
    compiled = kiln.compile(model, fullgraph=True).forward.aot_compile(((x,), {}))
    compiled.save_compiled_function(tmp_path / "heads.kiln")
    loaded = kiln.load_compiled_function(tmp_path / "heads.kiln")
    run = lambda t: loaded(model, t)  # noqa: E731
    _same(_step(run, model, x, use_aux=False), _step(model, model, x, use_aux=False))
    _same(_step(run, model, x, use_aux=True), _step(model, model, x, use_aux=True))
