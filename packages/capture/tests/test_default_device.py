"""The default device (``with torch.device(d)``, ``torch.set_default_device``) is global state a
graph depends on: factory calls without ``device=`` allocate there. It is part of the GLOBAL_STATE
guard, so a graph captured under one default device never runs under another (a backend may bake
the device into its code). On CPU: the meta device against cpu, called repeatedly with fresh inputs."""

import pytest
import torch

import kiln.capture as kc
from kiln.graph import default_device

from .conftest import Recorder


def factories(x):
    return x + 1, torch.ones(2) * 2, torch.zeros_like(x), torch.arange(3.0) + x.sum(), torch.empty(2).shape


class DeviceBakingBackend(Recorder):
    """A backend that, like a code generator, fixes the default device when it compiles: its
    callable refuses to run under another one."""

    def __call__(self, gm, example_inputs):
        run = super().__call__(gm, example_inputs)
        baked = default_device()

        def call(*args):
            assert default_device() == baked, f"graph compiled under {baked} run under {default_device()}"
            return run(*args)
        return call


def _same(got, want):
    assert type(got) is type(want) and len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert g.device == w.device and g.dtype == w.dtype and g.shape == w.shape, (g, w)
            if w.device.type != "meta":
                torch.testing.assert_close(g, w)
        else:
            assert g == w


def _context(name):
    return torch.device(name) if name is not None else _Nothing()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("fn", [factories])
def test_contexts_alternate_with_fresh_inputs(fn):
    kc.reset()
    backend = DeviceBakingBackend()
    opt = kc.optimize(fn, backend)
    for name in [None, "meta", "cpu", "meta", None, "meta", None]:
        x = torch.randn(3)
        with _context(name):
            _same(opt(x), fn(x))
    assert backend.count == 2, backend.count  # one graph per default device ("cpu" is no context)


def test_set_default_device():
    kc.reset()
    backend = DeviceBakingBackend()
    opt = kc.optimize(factories, backend)
    try:
        for d in [None, "meta", "meta", None, "meta"]:
            torch.set_default_device(d)
            x = torch.randn(3, device="cpu")
            _same(opt(x), factories(x))
    finally:
        torch.set_default_device(None)
    assert backend.count == 2, backend.count


def test_context_inside_the_compiled_code_is_not_confused_with_the_callers():
    def f(x):
        with torch.device("meta"):
            m = torch.ones(3)
        return x * 2, torch.zeros(2), m.shape
    kc.reset()
    backend = DeviceBakingBackend()
    opt = kc.optimize(f, backend)
    for name in [None, "meta", None]:
        x = torch.randn(3)
        with _context(name):
            _same(opt(x), f(x))


def test_default_device_reads_the_innermost_context():
    assert default_device() is None
    with torch.device("meta"):
        assert default_device() == "meta"
        with torch.device("cpu"):
            assert default_device() is None
        assert default_device() == "meta"
    assert default_device() is None


class Tf32BakingBackend(Recorder):
    """Like kiln's Triton matmul templates, which write TF32 or IEEE into their dot when compiled."""

    def __call__(self, gm, example_inputs):
        run = super().__call__(gm, example_inputs)
        baked = torch.backends.cuda.matmul.allow_tf32

        def call(*args):
            assert torch.backends.cuda.matmul.allow_tf32 == baked, "graph compiled under another TF32 setting"
            return run(*args)
        return call


def test_tf32_switch_recompiles():
    kc.reset()
    backend = Tf32BakingBackend()
    opt = kc.optimize(lambda a, b: a @ b + 1, backend)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for tf32 in [False, True, False, True, True]:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = torch.randn(3, 4), torch.randn(4, 2)
            torch.testing.assert_close(opt(a, b), a @ b + 1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert backend.count == 2, backend.count
