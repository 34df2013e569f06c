"""torch functions that set or read global state inside compiled code run in Python on every call.

Before: a ``torch.set_*`` call (``set_num_threads``, ``set_autocast_enabled``, ``set_default_device``,
``set_float32_matmul_precision``, ``set_warn_always``...) with no tensor argument ran once, at capture,
and was not recorded: later calls left the state as the caller had it. And a reader of state no guard
covers (``get_num_threads``, ``is_anomaly_enabled``, ``is_inference_mode_enabled`` under no_grad vs
inference_mode, ``get_float32_matmul_precision`` between "high" and "medium"...) returned the capture's
value on every call. Each program is called several times, with the state changed between calls,
against eager."""

from __future__ import annotations

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder

# (name, reader, setter, values the caller sets between calls, the value to restore)
STATES = [
    ("num_threads", torch.get_num_threads, torch.set_num_threads, (1, 2, 1), torch.get_num_threads()),
    ("matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision,
     ("high", "medium", "high"), torch.get_float32_matmul_precision()),
    ("warn_always", torch.is_warn_always_enabled, torch.set_warn_always, (False, True, False), False),
    ("anomaly", torch.is_anomaly_enabled, torch.set_anomaly_enabled, (False, True, False), False),
    ("autocast_cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled,
     (True, False, True), True),
    ("deterministic_debug_mode", torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode,
     (0, 1, 0), 0),
]


def _reads(reader):
    def f(x):
        return x + 1.0 if reader() in (1, True, "high") else x - 1.0
    return f


def _sets(setter, value):
    def f(x):
        setter(value)
        return x * 2
    return f


@pytest.mark.parametrize("name, reader, setter, values, restore", STATES, ids=[s[0] for s in STATES])
def test_a_state_read_is_not_the_captures_value(name, reader, setter, values, restore):
    kc.reset()
    fn = _reads(reader)
    opt = kc.optimize(fn, Recorder())
    try:
        for v in values:
            setter(v)
            x = torch.randn(3)
            torch.testing.assert_close(opt(x), fn(x))
    finally:
        setter(restore)


@pytest.mark.parametrize("name, reader, setter, values, restore", STATES, ids=[s[0] for s in STATES])
def test_a_state_set_inside_takes_effect_on_every_call(name, reader, setter, values, restore):
    kc.reset()
    opt = kc.optimize(_sets(setter, values[1]), Recorder())
    try:
        for _ in range(3):
            setter(values[0])
            x = torch.randn(3)
            torch.testing.assert_close(opt(x), x * 2)
            assert reader() == values[1]
    finally:
        setter(restore)


def test_inference_mode_and_no_grad_are_told_apart():
    def f(x):
        return x + 1 if torch.is_inference_mode_enabled() else x - 1
    kc.reset()
    opt = kc.optimize(f, Recorder())
    for inference in (False, True, False, True):
        with torch.inference_mode() if inference else torch.no_grad():
            x = torch.randn(3)
            torch.testing.assert_close(opt(x), f(x))


def test_autocast_and_default_device_set_inside_take_effect_on_every_call():
    def f(x):
        torch.set_autocast_enabled("cpu", True)
        torch.set_default_device("meta")
        return x * 2
    kc.reset()
    opt = kc.optimize(f, Recorder())
    try:
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(opt(x), x * 2)
            assert torch.is_autocast_enabled("cpu") and torch.get_default_device().type == "meta"
            torch.set_autocast_enabled("cpu", False)
            torch.set_default_device(None)
    finally:
        torch.set_autocast_enabled("cpu", False)
        torch.set_default_device(None)
