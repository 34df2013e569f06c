"""Attributes of Python modules are state a program may change between calls (a config module's
``SCALE``, a module-level table, ``os.environ``): they are guarded like globals, never baked into the
graph. Attributes of libraries kiln treats as constants (torch, numpy, math, ...) are not guarded.
Fresh inputs and changed values on every call, compared with eager."""

import os
import sys
import types

import torch

import kiln.capture as kc

from .conftest import Recorder

cfg = types.ModuleType("kiln_capture_test_cfg")
cfg.SCALE, cfg.TABLE, cfg.MODE = 1.0, {"a": 1}, "x"
sys.modules[cfg.__name__] = cfg


def helper_scale():
    return 2.0


cfg.helper = helper_scale


def reads_module(x):
    y = x * cfg.SCALE + cfg.TABLE["a"] + cfg.helper()
    if cfg.MODE == "y":
        y = y - 100
    return y


def test_module_attributes_changed_between_calls():
    kc.reset()
    opt = kc.optimize(reads_module, Recorder(), recompile_limit=40)
    try:
        for i in range(6):
            cfg.SCALE, cfg.MODE = float(i % 3), "xy"[i % 2]
            cfg.TABLE["a"] = i * 10
            cfg.helper = helper_scale if i % 2 else (lambda: -1.0)
            x = torch.randn(3)
            torch.testing.assert_close(opt(x), reads_module(x))
    finally:
        cfg.SCALE, cfg.TABLE, cfg.MODE, cfg.helper = 1.0, {"a": 1}, "x", helper_scale


def test_unchanged_module_attributes_compile_once():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(reads_module, rec)
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), reads_module(x))
    assert rec.count == 1


def reads_environ(x):
    return x * float(os.environ.get("KILN_CAPTURE_TEST_SCALE", "1"))


def test_environment_variable_changed_between_calls(monkeypatch):
    kc.reset()
    opt = kc.optimize(reads_environ, Recorder())
    for v in ["2", "3", None, "3"]:
        if v is None:
            monkeypatch.delenv("KILN_CAPTURE_TEST_SCALE", raising=False)
        else:
            monkeypatch.setenv("KILN_CAPTURE_TEST_SCALE", v)
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), reads_environ(x))


def test_library_attributes_are_not_guarded():
    def f(x):
        return torch.relu(x) * torch.pi + torch.float32.itemsize
    text = kc.capture_graph(f, (torch.randn(3),), {}).as_text()
    guards = text.split("# guards:")[1].splitlines()
    assert not [g for g in guards if "G['torch']" in g], guards


class Options:
    pass


class MaybeScaled(torch.nn.Module):
    def forward(self, x):
        s = getattr(self, "scale", None)
        return x if s is None else x * s


def reads_absent(x, opts):
    y = x + getattr(opts, "bias", 0.0)
    if hasattr(cfg, "SHIFT"):
        y = y - cfg.SHIFT
    try:
        return y * opts.gain
    except AttributeError:
        return y


def test_absent_attribute_gained_and_lost_between_calls():
    """``getattr(o, name, default)``, ``hasattr`` and ``try: o.name`` took the absent branch: an
    object or module that gains the attribute later must not rerun that trace (it returned the
    default's result once, silently)."""
    kc.reset()
    opt = kc.optimize(reads_absent, Recorder(), recompile_limit=40)
    try:
        for i in range(6):
            opts = Options()
            if i % 2:
                opts.bias = float(i)
            if i % 3 == 1:
                opts.gain = 2.0 + i
            if i in (2, 3):
                cfg.SHIFT = float(i)
            elif hasattr(cfg, "SHIFT"):
                del cfg.SHIFT
            x = torch.randn(3)
            torch.testing.assert_close(opt(x, opts), reads_absent(x, opts))
    finally:
        if hasattr(cfg, "SHIFT"):
            del cfg.SHIFT
    m = MaybeScaled()
    opt_m = kc.optimize(m, Recorder())
    for scale in [None, 3.0, torch.tensor(2.0), None]:
        if scale is None:
            m.__dict__.pop("scale", None)
        else:
            m.scale = scale
        x = torch.randn(3)
        torch.testing.assert_close(opt_m(x), m(x))
