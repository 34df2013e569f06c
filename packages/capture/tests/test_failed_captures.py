"""A frame whose capture fails on every call runs eagerly for good after a few tries, instead of
re-tracing on every call (correct either way, but a trace per call is far slower than eager)."""

import torch

import kiln.capture as kc
from kiln.graph import EVENTS, FrameRunEagerly

_lib = torch.library.Library("kiln_capture_test", "DEF")  # noqa: TOR901 - a test-only op library
_lib.define("no_fake(Tensor x) -> Tensor")
_lib.impl("no_fake", lambda x: x * 3, "CompositeExplicitAutograd")


@torch.library.register_fake("kiln_capture_test::no_fake")
def _no_fake(x):
    raise RuntimeError("this op cannot run on fake tensors")


class Recorder:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def test_a_capture_that_fails_every_call_stops_retrying() -> None:
    kc.reset()
    rec = Recorder()

    def f(x):
        return torch.ops.kiln_capture_test.no_fake(x.sin()) + 1

    opt = kc.optimize(f, rec)
    seen: list[FrameRunEagerly] = []

    def listen(e: object) -> None:
        if isinstance(e, FrameRunEagerly):
            seen.append(e)
    EVENTS.subscribe(listen)
    try:
        for _ in range(6):
            x = torch.randn(5)
            torch.testing.assert_close(opt(x), f(x))  # eager's result every call
    finally:
        EVENTS.unsubscribe(listen)
    assert rec.count == 0
    assert len(seen) == 3, [e.reason for e in seen]  # three tries, then eager for good (counted once)
    assert "3 calls in a row" in seen[-1].reason and "fake tensors" in seen[-1].reason


def test_a_tracing_error_eager_does_not_raise_is_warned_once() -> None:
    """Tracing raised (here: an op whose fake kernel fails) where eager did not: the frame ran uncompiled,
    which a user must not learn only from an INFO log. One UserWarning per frame names the error and
    where it was raised; every call returns eager's values."""
    import warnings

    kc.reset()

    def f(x):
        return torch.ops.kiln_capture_test.no_fake(x.cos()) * 2

    opt = kc.optimize(f, Recorder())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            x = torch.randn(3, 4)
            torch.testing.assert_close(opt(x), f(x))
    ours = [w for w in caught if "kiln.capture: tracing" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert "RuntimeError" in text and "fake tensors" in text and "EAGERLY" in text, text
    assert "test_failed_captures.py" in text, text  # where it was raised: the fake kernel above
