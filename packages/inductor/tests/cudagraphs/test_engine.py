"""The CUDA engine's allocator settings around a recording (no GPU needed: the setter is replaced)."""

from __future__ import annotations

import dataclasses

import pytest

from kiln.inductor.cudagraphs import engine


def test_recording_turns_expandable_segments_on_and_back_keeping_the_users_settings(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(engine, "_SET_ALLOCATOR", calls.append)
    monkeypatch.setattr(engine, "KNOBS", dataclasses.replace(engine.KNOBS, alloc_conf="max_split_size_mb:128"))
    with pytest.raises(RuntimeError), engine._expandable_segments(True):  # noqa: SLF001
        assert calls == ["max_split_size_mb:128,expandable_segments:True"]
        raise RuntimeError("a failed capture still restores the settings")
    assert calls == ["max_split_size_mb:128,expandable_segments:True",
                     "max_split_size_mb:128,expandable_segments:False"]


@pytest.mark.parametrize(("conf", "knob", "expected"), [
    ("", True, True),
    ("expandable_segments:True", True, False),  # already everywhere: nothing to switch
    ("backend:cudaMallocAsync", True, False),  # another allocator: no expandable segments to ask for
    ("", False, False),  # KILN_CUDAGRAPH_EXPANDABLE=0
])
def test_expandable_default(monkeypatch, conf, knob, expected):
    monkeypatch.setattr(engine, "_SET_ALLOCATOR", lambda s: None)
    monkeypatch.setattr(engine, "KNOBS", dataclasses.replace(engine.KNOBS, alloc_conf=conf,
                                                             cudagraph_expandable=knob))
    assert engine._expandable_default() is expected  # noqa: SLF001
