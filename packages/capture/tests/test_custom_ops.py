"""Calls of torch.library custom ops are recorded as one node each, not graph breaks."""

from __future__ import annotations

import torch

import kiln.capture as kc

from .conftest import Recorder


@torch.library.custom_op("kiln_capture_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("kiln_capture_test::bump_", mutates_args=("x",))
def bump_(x: torch.Tensor) -> None:
    x.add_(1)


@bump_.register_fake
def _(x: torch.Tensor) -> None:
    return None


def _uses_custom_op(x, y):
    return torch.ops.kiln_capture_test.scaled_tanh(x + y, 3.0) * 2


def test_custom_op_is_one_node_of_one_graph() -> None:
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(_uses_custom_op, rec)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(opt(x, y), _uses_custom_op(x, y))
    assert rec.count == 1
    assert kc.explain(_uses_custom_op)(x, y).break_count == 0
    targets = [n.target for n in rec.graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.kiln_capture_test.scaled_tanh.default in targets or \
        torch.ops.kiln_capture_test.scaled_tanh in targets


def _mutates_with_custom_op(x):
    y = x * 2
    torch.ops.kiln_capture_test.bump_(y)
    return y + 1


def test_mutating_custom_op_still_breaks() -> None:
    kc.reset()
    x = torch.randn(3)
    ex = kc.explain(_mutates_with_custom_op)(x)
    assert ex.break_count >= 1
    opt = kc.optimize(_mutates_with_custom_op, Recorder())
    torch.testing.assert_close(opt(x), _mutates_with_custom_op(x))
