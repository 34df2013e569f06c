"""kiln's notes about triton's kernel objects are declared data kept beside them (triton_notes.py):
nothing is set on triton's objects, a note dies with its kernel, and a launch description survives
the JSON round trip a save and load make."""

from __future__ import annotations

import gc
import json

from kiln.runtime.triton_notes import KernelNotes, LaunchRecord


class Kernel:  # a stand-in for triton's CompiledKernel / JITFunction (plain objects)
    pass


DESCRIPTION = [[["XBLOCK", 128]], 4, 1, ["None", "False"], [["T", "torch.float32", True], ["i", False, True, True, True]]]


def test_launch_record_round_trips_through_json() -> None:
    record = LaunchRecord.of(DESCRIPTION)
    assert record is not None and record.as_data() == DESCRIPTION
    assert LaunchRecord.of(json.loads(json.dumps(DESCRIPTION))) == record  # what a load reads back
    assert LaunchRecord.of(None) is None and LaunchRecord.of({"not": "a launch"}) is None
    assert LaunchRecord.of([object()]) is None  # not JSON data: never noted


def test_notes_are_beside_the_kernel_not_on_it() -> None:
    notes, kernel, fn = KernelNotes(), Kernel(), Kernel()
    first, second = LaunchRecord.of(DESCRIPTION), LaunchRecord.of([[], 8, 1, [], []])
    notes.note_launch(kernel, first)
    notes.note_launch(kernel, second)  # a kernel is compiled by one launch: the first note stays
    notes.mark_preloaded(fn)
    assert notes.launch(kernel) == first and notes.launch(Kernel()) is None
    assert notes.preloaded(fn) and not notes.preloaded(kernel)
    assert vars(kernel) == {} and vars(fn) == {}  # nothing set on the objects themselves
    del kernel, fn
    gc.collect()
    assert len(notes._launches) == 0 and len(notes._preloaded) == 0  # notes die with their kernels
