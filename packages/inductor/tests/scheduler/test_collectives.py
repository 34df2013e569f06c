"""Functional collectives in the memory plan (lowering/collectives.py, scheduler/memory.py): a
collective's operand lives until its wait (the communication reads it until then), its output and
the wait's are one storage that no later buffer takes while either name is read, and the C++
in-place pass does not write over one name of that storage while the kernel reads the other.
Programs are given as loop-IR text (no process group needed); 2-rank runs are in
tests/test_distributed_collectives.py."""

from __future__ import annotations

import dataclasses

from kiln.inductor import InductorOptions
from kiln.inductor.ir import ExternKernel, parse_program
from kiln.inductor.scheduler import schedule
from kiln.inductor.scheduler.inplace import plan_inplace_reuse

# buf2/buf3 run while the all-gather is in flight and are buf0's size; buf5 is buf1's size and is
# written while the wait's alias buf4 is still read (by buf6)
PROGRAM = """# loop program graph
arg0: float32[6](1) = input 0
arg1: float32[6](1) = input 1
buf0: float32[6](1) = pointwise[6] mul(arg0[i0], 2.0)
buf1: float32[12](1) = extern _c10d_functional.all_gather_into_tensor.default(buf0.view([6], (1), +0), 2, '0')
buf2: float32[6](1) = pointwise[6] cos(arg1[i0])
buf3: float32[6](1) = pointwise[6] sin(buf2[i0])
buf4: float32[12](1) = extern _c10d_functional.wait_tensor.default(buf1.view([12], (1), +0)) holding [buf0]
buf5: float32[12](1) = pointwise[12] mul(buf4[i0], 2.0)
buf6: float32[12](1) = pointwise[12] add(buf5[i0], buf4[i0])
return (buf6.view([12], (1), +0), buf3.view([6], (1), +0))"""

UNFUSED = InductorOptions(fuse=False)


def _storage_users(steps) -> list[tuple[int, str, str]]:
    """(step, buffer, the buffer whose memory it takes) for every hand-over."""
    return [(k, a.buffer, a.reuse) for k, st in enumerate(steps) for a in st.allocate if a.reuse]


def _step_of(steps, buffer: str) -> int:
    return next(k for k, st in enumerate(steps)
                if isinstance(st.work, ExternKernel) and any(o.buffer == buffer for o in st.work.outputs))


def test_holds_round_trip_in_the_text() -> None:
    p = parse_program(PROGRAM)
    assert p.as_text() == PROGRAM
    wait = next(n for n in p.nodes if isinstance(n, ExternKernel) and n.target.endswith("wait_tensor.default"))
    assert wait.holds == ("buf0",)


def test_operand_in_flight_and_output_alias_are_not_handed_on() -> None:
    s = schedule(parse_program(PROGRAM), UNFUSED)
    steps = s.steps
    wait = _step_of(steps, "buf4")
    frees = {b: k for k, st in enumerate(steps) for b in st.free}
    assert frees["buf0"] >= wait  # the all-gather reads it until the wait
    assert frees["buf1"] == frees["buf4"]  # one storage, one lifetime
    for k, b, reused in _storage_users(steps):
        assert reused != "buf0" or k > wait, (b, reused)
        assert reused not in ("buf1", "buf4"), (b, reused)  # buf4 is read until the last kernel


def test_without_holds_the_plan_would_reuse_the_operand_in_flight() -> None:
    """The hazard the holds prevent: with them dropped, buf2 takes buf0's memory before the wait."""
    p = parse_program(PROGRAM)
    nodes = tuple(dataclasses.replace(n, holds=()) if isinstance(n, ExternKernel) else n for n in p.nodes)
    s = schedule(dataclasses.replace(p, nodes=nodes), UNFUSED)
    assert ("buf2", "buf0") in [(b, r) for _, b, r in _storage_users(s.steps)]


def test_kernel_reading_both_names_does_not_write_over_either() -> None:
    text = PROGRAM.replace("add(buf5[i0], buf4[i0])", "add(buf1[i0], buf4[i0])")
    s = plan_inplace_reuse(schedule(parse_program(text), UNFUSED))
    last = s.steps[-1].work
    assert not {i for _, i in last.inplace} & {"buf1", "buf4"}, last.inplace


def test_kernel_reading_one_name_may_write_over_it() -> None:
    s = plan_inplace_reuse(schedule(parse_program(PROGRAM), UNFUSED))
    over = {i for st in s.steps if hasattr(st.work, "inplace") for _, i in st.work.inplace}
    assert over & {"buf4", "buf5"}  # the last add writes over a dying input: one storage fewer


def test_a_read_of_the_collective_output_after_its_wait_is_not_fused_before_it() -> None:
    """Eager code may read the tensor it waited on (``wait_tensor(h); h * 2``): that read must not
    join a kernel that runs while the communication still writes ``h`` (buf2's, over the same space)."""
    text = PROGRAM.replace("buf5: float32[12](1) = pointwise[12] mul(buf4[i0], 2.0)",
                           "buf5: float32[12](1) = pointwise[12] mul(buf1[i0], 2.0)")
    text = text.replace("buf2: float32[6](1) = pointwise[6] cos(arg1[i0])",
                        "buf2: float32[12](1) = pointwise[12] cos(arg1[(i0)//2])")
    text = text.replace("buf3: float32[6](1) = pointwise[6] sin(buf2[i0])",
                        "buf3: float32[6](1) = pointwise[6] sin(buf2[2*i0])")
    steps = schedule(parse_program(text), InductorOptions()).steps
    wait = _step_of(steps, "buf4")
    reader = next(k for k, st in enumerate(steps)
                  if any(kn.buffer == "buf5" for kn in getattr(st.work, "nodes", ())))
    assert reader > wait
