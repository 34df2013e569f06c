"""Functions wrapped with functools.wraps (Hugging Face decorates ``forward`` so) are bound by the
wrapper's own signature — the frame capture names its sources in (``L['args'][0]``)."""

from __future__ import annotations

import functools

from kiln.runtime import CallFrame
from kiln.runtime.sources import make_binder, params_of


def _decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_decorate
def forward(x, y=2):
    return x * y


def test_frame_and_binder_follow_the_code_that_runs() -> None:
    frame = CallFrame.of(forward, (3,), {"y": 4})
    assert frame.locals["args"] == (3,) and frame.locals["kwargs"] == {"y": 4}
    assert [p.name for p in params_of(forward)] == ["args", "kwargs"]
    bind = make_binder(params_of(forward))
    assert bind((5,), {}) == {"args": (5,), "kwargs": {}}
    assert eval("L['args'][0]", {"L": bind((5,), {})}) == 5
