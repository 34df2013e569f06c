"""Compile events: counted always, handed to listeners, stage texts only when a listener keeps them."""

from __future__ import annotations

from kiln.graph import (
    EVENTS,
    CacheLookup,
    EventLog,
    GraphBreakEvent,
    StageText,
    StageTime,
    dump,
    keeping_texts,
)


def test_counts_seconds_and_listeners() -> None:
    log = EventLog()
    seen: list[object] = []
    log.subscribe(seen.append)
    log.emit(GraphBreakEvent("f (a.py:1)", "print", ("a.py:2 in f",)))
    log.emit(CacheLookup("inductor", True, "abc"))
    log.emit(CacheLookup("inductor", False, "def"))
    log.emit(StageTime("capture", 0.25))
    log.emit(StageTime("capture", 0.5))
    counts, seconds = log.snapshot()
    assert counts["GraphBreakEvent"] == 1 and counts["CacheHit"] == 1 and counts["CacheMiss"] == 1
    assert seconds == {"capture": 0.75} and len(seen) == 5
    log.unsubscribe(seen.append)
    log.reset()
    assert log.snapshot() == ({}, {}) and not log.listeners


def test_dump_hands_stage_texts_only_to_a_listener_that_keeps_them() -> None:
    texts: list[StageText] = []

    def keep(e: object) -> None:
        if isinstance(e, StageText):
            texts.append(e)
    dump("001_g", "ir", "text one")  # nobody keeps texts: nothing is emitted
    assert not keeping_texts() or EVENTS.keeps_texts()
    EVENTS.subscribe(keep, texts=True)
    try:
        assert keeping_texts()
        dump("001_g", "ir", "text two")
    finally:
        EVENTS.unsubscribe(keep)
    assert [(t.graph_id, t.stage, t.text) for t in texts] == [("001_g", "ir", "text two")]
