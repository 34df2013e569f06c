"""The CUDA engine's allocator settings around a recording (no GPU needed: the setter is replaced)."""

from __future__ import annotations

import pytest

from kiln.inductor.cudagraphs import engine


def test_recording_turns_expandable_segments_on_and_back_keeping_the_users_settings():
    calls: list[str] = []
    settings = engine.AllocatorSettings("max_split_size_mb:128", True, calls.append)
    with pytest.raises(RuntimeError), settings.expandable_segments(True):
        assert calls == ["max_split_size_mb:128,expandable_segments:True"]
        raise RuntimeError("a failed capture still restores the settings")
    assert calls == ["max_split_size_mb:128,expandable_segments:True",
                     "max_split_size_mb:128,expandable_segments:False"]
    with settings.expandable_segments(False):  # an inference recording: nothing set
        pass
    assert len(calls) == 2


@pytest.mark.parametrize(("conf", "knob", "expected"), [
    ("", True, True),
    ("expandable_segments:True", True, False),  # already everywhere: nothing to switch
    ("backend:cudaMallocAsync", True, False),  # another allocator: no expandable segments to ask for
    ("", False, False),  # KILN_CUDAGRAPH_EXPANDABLE=0
])
def test_expandable_default(conf, knob, expected):
    assert engine.AllocatorSettings(conf, knob, lambda s: None).expandable_default() is expected
    assert engine.AllocatorSettings(conf, knob, None).expandable_default() is False  # torch cannot set them


def test_the_default_settings_come_from_the_knobs():
    from kiln.inductor.knobs import KNOBS

    settings = engine.AllocatorSettings()
    assert (settings.user_conf, settings.expandable_allowed) == (KNOBS.alloc_conf, KNOBS.cudagraph_expandable)
