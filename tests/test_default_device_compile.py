"""kiln.compile under ``with torch.device("meta")`` after compiling under none: the CPU program is not
reused (factory outputs would be written into meta storage by C++ kernels), and the graph whose
factories make meta tensors runs through ATen, not generated C++. Fresh inputs each call."""

import torch

import kiln


def factories(x):
    return x + 1, torch.ones(2) * 2, torch.zeros_like(x), torch.arange(3.0) + x.sum()


def test_cpu_program_never_runs_under_a_meta_default_device():
    kiln.reset()
    opt = kiln.compile(factories)
    for name in [None, "meta", None, "meta"]:
        x = torch.randn(3)
        ctx = torch.device(name) if name else torch.device("cpu")
        with ctx:
            want, got = factories(x), opt(x)
        for g, w in zip(got, want):
            assert g.device == w.device and g.shape == w.shape and g.dtype == w.dtype
            if w.device.type == "cpu":
                torch.testing.assert_close(g, w)
