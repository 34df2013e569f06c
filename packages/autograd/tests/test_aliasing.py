"""Outputs that alias inputs or each other are rebuilt as views at run time, like eager."""

from __future__ import annotations

import pytest
import torch
from ag_util import check, compile_fn  # type: ignore[import-not-found]

from kiln.autograd import OutputKind

VIEW_OUTPUTS = {
    "input_itself": lambda x, w: (x, (x * w).sum()),
    "view_of_input": lambda x, w: (x.view(-1), (x * w).sum()),
    "slice_of_input": lambda x, w: (x[1:], x * w),
    "t_of_input": lambda x, w: (x.t(), w * 2),
    "param_view": lambda x, w: (w.t(), (x @ w).sum()),
    "param_itself": lambda x, w: (w, x + 1),
    "two_views_of_output": lambda x, w: _two(x * w),
    "view_of_output": lambda x, w: _out_and_view(x @ w),
    "same_twice": lambda x, w: _same(x + w),
    "detached_input_view": lambda x, w: (w.detach()[0], x * w),
    "diag_of_param": lambda x, w: (w.diagonal(), (x * w).sum()),
    "unbind_input": lambda x, w: (x.unbind(0)[1], x.unbind(0)[2], w.sum()),
    "int_output": lambda x, w: (x * w, 3),
    "none_output": lambda x, w: (x * w, None),
    "dict_output": lambda x, w: {"a": x * w, "b": (x - w,)},
    "nondiff_output": lambda x, w: ((x * w).argmax(), (x * w).sum()),
    "detached_output": lambda x, w: ((x * w).detach(), (x * w).sum()),
    "bool_output": lambda x, w: (x > w, (x * w).sum()),
}


def _two(y):  # type: ignore[no-untyped-def]
    return y, y[0], y.t()


def _out_and_view(y):  # type: ignore[no-untyped-def]
    return y, y.view(-1)


def _same(y):  # type: ignore[no-untyped-def]
    return y, y


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g).requires_grad_()]


@pytest.mark.parametrize("name", list(VIEW_OUTPUTS))
@pytest.mark.parametrize("partitioner", ["min_cut", "save_all"])
def test_alias_outputs_match_eager(name: str, partitioner: str) -> None:
    check(VIEW_OUTPUTS[name], _inputs(), partitioner=partitioner)


def test_output_is_input_object() -> None:
    x, w = _inputs()
    out = compile_fn(lambda x, w: (x, w * 2), [x, w])(x, w)
    assert out[0] is x


def test_view_of_input_shares_storage() -> None:
    x, w = _inputs()
    c = compile_fn(lambda x, w: (x[1:], w * 2), [x, w])
    out = c(x, w)
    assert out[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x[1, 0] = 42.0
    assert out[0][0, 0].item() == 42.0
    assert c.aot.joint.signature.outputs[0].kind is OutputKind.ALIAS_INPUT


def test_view_of_output_shares_storage() -> None:
    x, w = _inputs()
    out = compile_fn(lambda x, w: _out_and_view(x @ w), [x, w])(x, w)
    assert out[1].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr()


def test_same_output_twice_is_one_object() -> None:
    x, w = _inputs()
    out = compile_fn(lambda x, w: _same(x + w), [x, w])(x, w)
    assert out[0] is out[1]


def test_grad_flows_through_regenerated_param_view() -> None:
    x, w = _inputs()
    out = compile_fn(lambda x, w: (w.t(), x.sum()), [x, w])(x, w)
    (out[0] * torch.arange(16.0).view(4, 4)).sum().backward()
    torch.testing.assert_close(w.grad, torch.arange(16.0).view(4, 4).t())
