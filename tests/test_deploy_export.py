"""kiln.export: one static inference graph with named constants, and clear errors for what it refuses."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch import nn

import kiln
import kiln.runtime
from kiln.deploy import ExportError


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> dict[str, torch.Tensor]:
        y = torch.relu(self.norm(self.fc(x))) * scale
        return {"y": y, "total": y.sum(dim=1)}


def test_export_names_constants_and_specs() -> None:
    m = Small().eval()
    x = torch.randn(3, 8)
    e = kiln.export(m, (x,))
    assert [i.name for i in e.inputs] == ["x"]
    assert {"fc.weight", "fc.bias", "norm.weight", "norm.bias", "norm.running_mean",
            "norm.running_var"} <= set(e.constants)
    assert all(t.is_contiguous() for t in e.constants.values())
    assert [tuple(o.shape) for o in e.outputs] == [(3, 4), (3,)]
    text = e.as_text()
    assert "x: " in text and "fc.weight" in text and "aten." in text
    for _ in range(3):  # the exported graph computes what the module does, for fresh inputs
        x = torch.randn(3, 8)
        got, want = e(x), m(x)
        assert set(got) == {"y", "total"}
        torch.testing.assert_close(got["y"], want["y"])
        torch.testing.assert_close(got["total"], want["total"])


def test_export_function_with_two_inputs() -> None:
    w = torch.randn(8, 8)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ w) + b

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    e = kiln.export(f, (a, b))
    assert [i.name for i in e.inputs] == ["a", "b"]
    assert len(e.constants) == 1  # the closure's tensor
    torch.testing.assert_close(e(a, b), f(a, b))


def test_dynamic_shapes_name_symbols_and_ranges() -> None:
    m = Small().eval()
    e = kiln.export(m, (torch.randn(3, 8),), dynamic_shapes={"x": {0: (2, 64)}})
    (z,) = e.sizes
    assert (z.input, z.dim, z.min, z.max) == (0, 0, 2, 64)
    assert isinstance(e.inputs[0].spec.shape[0], sympy.Symbol) and e.inputs[0].spec.shape[1] == 8
    assert f"{z.symbol} = input 'x' dim 0, in [2, 64]" in e.as_text()
    for n in (2, 5, 64):  # the exported graph itself serves every size
        x = torch.randn(n, 8)
        torch.testing.assert_close(e(x)["y"], m(x)["y"])


@pytest.mark.parametrize(("shapes", "message"), [
    ({"x": {0: (1, 64)}}, r"input 'x' dim 0 in range \(1, 64\): a dynamic size ranges over 2 <= min <= max"),
    ({"x": {0: (8, 4)}}, r"2 <= min <= max"),
    ({"x": {0: (4, 64)}}, r"input 'x' dim 0 is 3 in the example, outside its range \(4, 64\)"),
    ({"x": {2: (2, 64)}}, r"input 'x' has 2 dims; dim 2 does not exist"),
    ({"x": {0: 64}}, r"expected a range \(min, max\) of two ints, got 64"),
    ({"y": {0: (2, 64)}}, r"'y' is not a tensor input of the call; its tensor inputs are 'x'"),
])
def test_bad_dynamic_shapes_refused(shapes: dict, message: str) -> None:
    with pytest.raises(ExportError, match=message):
        kiln.export(Small().eval(), (torch.randn(3, 8),), dynamic_shapes=shapes)


def test_dynamic_dim_the_program_fixes_is_refused() -> None:
    w = torch.randn(3, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + w  # x's dim 0 must be 3

    with pytest.raises(ExportError, match=r"input 'x' dim 0 was asked to vary in \(2, 8\), but the program fixes "
                                          r"it to 3"):
        kiln.export(f, (torch.randn(3, 8),), dynamic_shapes={"x": {0: (2, 8)}})


def test_dynamic_range_the_program_narrows_is_refused() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:  # a branch on the size: the capture serves sizes above 4 only
            return x * 2
        return x - 1

    with pytest.raises(ExportError, match=r"input 'x' dim 0 was to vary in \[2, 8\], but the program was traced or "
                                          r"compiled for \[5, 8\] only \(it assumed s\d+ > 4\)"):
        kiln.export(f, (torch.randn(6, 3),), dynamic_shapes={"x": {0: (2, 8)}})
    e = kiln.export(f, (torch.randn(6, 3),), dynamic_shapes={"x": {0: (5, 8)}})  # what it serves: fine
    assert [(z.min, z.max) for z in e.sizes] == [(5, 8)]


def test_dims_marked_dynamic_are_exported_with_their_range() -> None:
    """kiln.mark_dynamic on the example works as dynamic_shapes does; without a range, or on a
    non-contiguous example, it is refused."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)

    x = torch.randn(5, 8)
    kiln.mark_dynamic(x, 0, min=2, max=16)
    (z,) = kiln.export(f, (x,)).sizes
    assert (z.input, z.dim, z.min, z.max) == (0, 0, 2, 16)
    y = torch.randn(8, 6).t()
    kiln.mark_dynamic(y, 0, min=2, max=16)
    with pytest.raises(ExportError, match=r"input 'x' has symbolic sizes and strides \(1, s\d+\), not contiguous"):
        kiln.export(f, (y,))
    w = torch.randn(5, 8)
    kiln.mark_dynamic(w, 0)
    with pytest.raises(ExportError, match=r"has no finite range; give every dynamic dim a \(min, max\)"):
        kiln.export(f, (w,))


def test_training_mode_refused() -> None:
    with pytest.raises(ExportError, match=r"training mode.*\.eval\(\)"):
        kiln.export(Small(), (torch.randn(3, 8),))


def data_dependent(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # a graph break: the branch depends on the data
        return x * 2
    return x - 1


def test_graph_break_is_an_error_naming_the_line() -> None:
    with pytest.raises(ExportError) as info:
        kiln.export(data_dependent, (torch.randn(4),))
    msg = str(info.value)
    assert "data_dependent" in msg and "test_deploy_export.py" in msg


def test_input_mutation_refused() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    with pytest.raises(ExportError, match="writes into its inputs"):
        kiln.export(f, (torch.randn(4),))


def test_package_refuses_other_devices(tmp_path) -> None:  # type: ignore[no-untyped-def]
    e = kiln.export(Small().eval(), (torch.randn(3, 8),))
    with pytest.raises(ExportError, match="device 'xpu' is not supported; packages run on 'cpu' or 'cuda'"):
        kiln.package(e, tmp_path / "pkg", device="xpu")
    with pytest.raises(ExportError, match="options=.*InductorOptions"):
        kiln.package(e, tmp_path / "pkg", options={"no_such_option": 1})


def test_loader_checks_fixed_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A non-tensor argument is fixed at export: passing another value is an error, not a silent answer."""
    def f(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale

    x = torch.randn(4)
    kiln.package(kiln.export(f, (x, 3.0)), tmp_path / "pkg")
    p = kiln.load_package(tmp_path / "pkg")
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(p(x), x * 3.0)
        torch.testing.assert_close(p(x, 3.0), x * 3.0)
    with pytest.raises(kiln.runtime.GuardError, match=r"differ from the values fixed at export \(scale=3.0\)"):
        p(x, 2.0)


def test_tied_weights_are_one_constant() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    m = Tied().eval()
    e = kiln.export(m, (torch.randn(2, 4),))
    assert list(e.constants) == ["a.weight"]
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(e(x), m(x))
