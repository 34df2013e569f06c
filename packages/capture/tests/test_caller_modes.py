"""Torch modes the caller entered around a compiled call: a compiled graph runs below
``__torch_function__`` / ``__torch_dispatch__``, so under a user ``TorchFunctionMode`` or a
``TorchDispatchMode`` the call runs eagerly (the mode sees every op, as in eager) and outside them the
compiled entries serve again. The backend here runs the graph as generated code would: below the
modes. Fresh inputs on every call, compared with eager."""

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import kiln.capture as kc
from kiln.capture.controls import active_mode_reason

from .conftest import Recorder


class AddIsSub(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
            func = torch.sub
        return func(*args, **(kwargs or {}))


class Doubling(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.ops.aten.mul.Tensor else out


class BelowModes(Recorder):
    """Runs the graph with the torch modes off, as compiled kernels do."""

    def __call__(self, gm, example_inputs):
        run = super().__call__(gm, example_inputs)

        def call(*args):
            with torch._C.DisableTorchFunction(), torch.utils._python_dispatch._disable_current_modes():
                return run(*args)
        return call


def f(x):
    return torch.add(x, 1) * 3


def test_modes_around_compiled_calls_run_eagerly():
    kc.reset()
    backend = BelowModes()
    opt = kc.optimize(f, backend)
    for mode in [None, AddIsSub, None, Doubling, AddIsSub, None]:
        x = torch.randn(4)
        if mode is None:
            torch.testing.assert_close(opt(x), f(x))
            continue
        with mode():
            want = f(x)
        with mode():
            got = opt(x)
        torch.testing.assert_close(got, want)
    assert backend.count == 1, backend.count  # one graph, used outside the modes


def test_the_reason_names_the_mode():
    with AddIsSub():
        reason = active_mode_reason()
    assert reason is not None and "AddIsSub" in reason
    with torch.device("meta"):
        assert active_mode_reason() is None  # the default device is guarded instead
