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
