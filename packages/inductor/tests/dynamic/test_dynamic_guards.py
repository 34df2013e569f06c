"""Size guards: what a compile assumes about symbolic sizes is recorded, exposed and checked per call."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dynamic_helpers import compile_symbolic, symbolic_graph

from kiln.inductor import CppBackend, InductorOptions
from kiln.inductor.codegen.wrapper import wrapper_source
from kiln.inductor.compile import load_wrapper
from kiln.inductor.ir import SizeGuard
from kiln.inductor.size_guards import GuardWatch
from kiln.runtime import GuardError


def test_guard_watch_collects_what_a_compile_step_assumed():
    _, examples = symbolic_graph(lambda x: (x * 2,), torch.randn(37, 5))
    watch = GuardWatch(examples)
    assert watch.symbolic and watch.added("g") == ()
    n = examples[0].shape[0]
    assert int(n) == 37  # a pass asking a SymInt for a number specialises it
    added = watch.added("g")
    assert added and all("== 37" in g.expr for g in added), added


def test_fully_dynamic_graph_has_no_guards_and_reports_its_sources():
    cg = compile_symbolic(lambda x, y: (x @ y + 1,), torch.randn(37, 5), torch.randn(5, 11))
    assert cg.size_guards == ()  # type: ignore[attr-defined]
    assert sorted(cg.size_sources.values()) == [  # type: ignore[attr-defined]
        "arg0.size(0)", "arg0.size(1)", "arg1.size(1)"]


def test_wrapper_checks_size_guards_every_call():
    cg = compile_symbolic(lambda x: (x.sum(1),), torch.randn(37, 5))
    sched = cg.scheduled  # type: ignore[attr-defined]
    sym = sched.program.sizes[0].symbol
    program = dataclasses.replace(sched.program, size_guards=(SizeGuard(f"{sym} <= 64", "a test's choice"),))
    sched = dataclasses.replace(sched, program=program)
    # the same kernels (the C++ library is cached by source), a wrapper that checks the guard
    kernels = CppBackend().compile(sched, program.layouts(), InductorOptions())
    call = load_wrapper(wrapper_source(sched, kernels), kernels.local_dir, "<guarded>")
    for n in (3, 64, 10):  # repeated calls with fresh inputs
        x = torch.randn(n, 5)
        torch.testing.assert_close(call([x])[0], x.sum(1))
    with pytest.raises(GuardError, match=f"{sym} <= 64"):
        call([torch.randn(65, 5)])
