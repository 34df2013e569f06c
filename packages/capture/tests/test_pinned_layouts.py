"""Parameters and buffers are pinned by identity; one relaid out in place (``p.data = ...``,
``module.to(...)``, ``requires_grad_``, ``t_()``) must recompile, never reach a
graph compiled for its old layout. The backend here refuses any call whose inputs differ in layout
from the example inputs it compiled for (as generated code that baked sizes and strides would be
silently wrong), and every call is compared with eager on fresh inputs."""

import pytest
import torch
from torch import nn

import kiln.capture as kc
from kiln.capture.pinned_layouts import EPOCH, pinned_layouts

from .conftest import assert_same


def _layout(t):
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


class LayoutStrict:
    """Runs the graph, but only on inputs of the layouts it was compiled for."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        want = [_layout(t) if isinstance(t, torch.Tensor) else None for t in example_inputs]

        def run(*args):
            got = [_layout(t) if isinstance(t, torch.Tensor) else None for t in args]
            assert got == want, f"a graph compiled for {want} was called with {got}"
            return gm(*args)
        return run


@pytest.fixture
def strict():
    kc.reset()
    return LayoutStrict()


def _same_as_eager(opt, module, make_input, calls=3):
    for _ in range(calls):
        x = make_input()
        assert_same(opt(x), module(x))


class Scale(nn.Module):
    """Reads its parameter's dtype and shape in the forward, as real code does."""

    def __init__(self, n=4, shift=True):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n))
        # module.to() replaces buffers by new tensors (their modules are then guarded by type)
        self.register_buffer("shift", torch.randn(n) if shift else torch.zeros((), dtype=torch.long))

    def forward(self, x):
        w = self.w
        y = x[..., :w.shape[0]].to(w.dtype) @ w + self.shift.to(w.dtype)
        return y.float()


def test_linear_weight_relaid_out_by_set_data(strict):
    m = nn.Linear(4, 3)
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(2, 4))
    m.weight.data = m.weight.data.t().contiguous().t()  # same values and shape, column-major
    _same_as_eager(opt, m, lambda: torch.randn(2, 4))
    assert strict.count == 2 and kc.recompile_count(opt) == 1


@pytest.mark.parametrize("change", ["dtype", "shape", "strides", "t_", "module_to"])
def test_parameter_changed_in_place(strict, change):
    m = Scale()
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    if change == "dtype":
        m.w.data = m.w.data.double()
    elif change == "shape":
        m.w.data = torch.randn(2, 4)  # the forward slices x by w.shape[0]
    elif change == "strides":
        m.w.data = torch.randn(8, 8)[::2, ::2]
    elif change == "t_":
        with torch.no_grad():
            m.w.t_()
    else:
        m.to(torch.float64)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    assert strict.count == 2


def test_buffer_relaid_out(strict):
    m = Scale()
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.shift.data = torch.randn(8)[::2]
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.shift.data = m.shift.data.to(torch.float64)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    assert strict.count == 3


def test_batchnorm_running_stats_replaced(strict):
    bn = nn.BatchNorm1d(4).eval()
    bn.running_mean.normal_()
    opt = kc.optimize(bn, strict)
    _same_as_eager(opt, bn, lambda: torch.randn(5, 4))
    bn.running_mean.data = torch.randn(8)[::2]
    bn.running_var.data = torch.rand(4, 3).t()[0]
    _same_as_eager(opt, bn, lambda: torch.randn(5, 4))
    assert strict.count == 2


def test_unfrozen_parameter_gets_its_gradient(strict):
    m = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    m[0].weight.requires_grad_(False)
    opt = kc.optimize(m, strict)
    opt(torch.randn(2, 4)).sum().backward()
    m[0].weight.requires_grad_(True)  # unfrozen after the compile
    for _ in range(2):
        x = torch.randn(2, 4)
        m.zero_grad(set_to_none=True)
        opt(x).sum().backward()
        got = [p.grad.clone() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()
        assert_same(got, [p.grad for p in m.parameters()])
    assert strict.count == 2


def test_replaced_parameter_object(strict):
    m = Scale()
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.w = nn.Parameter(torch.randn(4, 4).t())
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.w = nn.Parameter(torch.randn(2, 4, dtype=torch.float64))
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))


def test_same_layout_set_data_keeps_the_entry(strict):
    """``p.data = new values`` in the old layout (a manual optimizer step) is no recompile."""
    m = Scale()
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    for _ in range(3):
        m.w.data = m.w.data - 0.1 * torch.randn(4, 4)
        _same_as_eager(opt, m, lambda: torch.randn(3, 6), calls=1)
    assert strict.count == 1 and kc.recompile_count(opt) == 0


def test_back_to_the_first_layout_reuses_its_entry(strict):
    m = Scale(shift=False)
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.double()
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    m.float()
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    assert strict.count == 2


def test_layout_check_after_unrelated_and_related_changes():
    """A layout change anywhere in the process makes the next check compare the pinned layouts;
    an unrelated one leaves them valid."""
    ts = [torch.randn(3, 3) for _ in range(4)]
    check = pinned_layouts([(f"L['t{i}']", t) for i, t in enumerate(ts)])
    assert check is not None and check.same()
    before = EPOCH[0]
    torch.randn(2).data = torch.randn(2)  # an unrelated tensor
    assert EPOCH[0] > before and check.same()
    ts[2].data = ts[2].data.t()
    assert not check.same() and not check.same()
    assert check.failure() == ("L['t2']", check.expected[2], ("torch.float32", "cpu", (3, 3), (1, 3), False))
    ts[2].data = ts[2].data.t()
    assert check.same() and check.failure() is None


def test_recompile_reason_names_the_parameter(strict):
    m = nn.Linear(4, 3)
    opt = kc.optimize(m, strict)
    opt(torch.randn(2, 4))
    m.weight.data = m.weight.data.half()
    with pytest.raises(RuntimeError):  # half @ float: eager refuses it too
        m(torch.randn(2, 4))
    with kc.set_stance("fail_on_recompile"), \
            pytest.raises(RuntimeError, match=r"TENSOR_MATCH L\['self'\]._parameters\['weight'\].*float16"):
        opt(torch.randn(2, 4))


@pytest.mark.parametrize("layout", ["same", "transposed", "shape", "dtype"])
def test_swap_tensors_on_a_pinned_parameter(strict, layout):
    """``torch.utils.swap_tensors(p, new)`` keeps ``p``'s identity and gives it ``new``'s tensor: the
    compiled entry must see the new values (one entry while the layout is the same) and recompile
    when the layout changed. It refused before (the capture's fake mode kept a weak reference to p)."""
    m = Scale()
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    for _ in range(2):  # twice: the swapped-in tensor can be swapped again
        new = {"same": lambda: torch.randn(4, 4), "transposed": lambda: torch.randn(4, 4).t(),
               "shape": lambda: torch.randn(2, 4), "dtype": lambda: torch.randn(4, 4, dtype=torch.float64)}[layout]()
        torch.utils.swap_tensors(m.w, nn.Parameter(new))
        assert torch.equal(m.w, new)
        _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    assert strict.count == (1 if layout == "same" else 2)


def test_module_to_with_swap_module_params_on_conversion(strict):
    """``module.to(dtype)`` swaps the parameters' tensors in place under
    ``torch.__future__.set_swap_module_params_on_conversion(True)``."""
    m = Scale(shift=False)
    opt = kc.optimize(m, strict)
    _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        w = m.w
        m.double()
        assert m.w is w and m.w.dtype == torch.float64
        _same_as_eager(opt, m, lambda: torch.randn(3, 6))
        m.float()
        _same_as_eager(opt, m, lambda: torch.randn(3, 6))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert strict.count == 2
