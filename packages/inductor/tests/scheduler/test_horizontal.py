"""Horizontal fusion (scheduler/horizontal.py, codegen/cpp/group.py): independent pointwise kernels of a
graph launched as one C++ function with one parallel region over their flattened ranges. Every result
is compared with eager over several calls with fresh inputs, on one and two threads; the fusion is
checked in the schedule and in the generated code (launches, exported functions, parallel regions)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest
import torch
from dynamic_helpers import compile_symbolic
from tracer import trace

from kiln.graph import GraphAnnotations, annotate
from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.cpp.kernel import kernel_params
from kiln.inductor.cpp_program import Slot, cpp_program
from kiln.inductor.ir import Kernel, KernelGroup
from kiln.inductor.scheduler.horizontal import MAX_PARAMS, group_kernels

# sizes of every kind a model's parameters have: primes, odd 2-d, 3-d, one element, empty, large
SHAPES = [(37,), (13, 7), (5, 3, 7), (1,), (), (0,), (3, 0), (257,), (64, 1031), (11, 17)]
UNGROUPED = InductorOptions(strict_lowering=True, group_kernels=False)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _adam(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A functional Adam step over n tensors: flat = params + grads + exp_avgs + exp_avg_sqs; returns
    the new params, exp_avgs and exp_avg_sqs (kiln.autograd marks them as input mutations)."""
    n = len(flat) // 4
    ps, ms, vs = [], [], []
    for p, g, m, v in zip(flat[:n], flat[n:2 * n], flat[2 * n:3 * n], flat[3 * n:]):
        m2 = m * 0.9 + g * 0.1
        v2 = v * 0.999 + g * g * 0.001
        ps.append(p - 0.01 * m2 / ((v2 / 0.5).sqrt() + 1e-8))
        ms.append(m2)
        vs.append(v2)
    return (*ps, *ms, *vs)


def _state(shapes: list[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    flat = [torch.randn(s, generator=g) for _ in range(3) for s in shapes]
    return flat + [torch.rand(s, generator=g) for s in shapes]  # exp_avg_sq >= 0


def _compile_adam(shapes: list[tuple[int, ...]], options: InductorOptions | None = None):
    example = _state(shapes, 0)
    gm = trace(_adam, *example)
    n = len(shapes)
    mutations = tuple((i, i) for i in range(n)) + tuple((n + i, 2 * n + i) for i in range(n)) \
        + tuple((2 * n + i, 3 * n + i) for i in range(n))
    annotate(gm, GraphAnnotations(input_mutations=mutations))
    return compile_graph(gm, example, **({"options": options} if options else {}))


def _check_adam(cg, shapes: list[tuple[int, ...]], calls: int = 3) -> None:
    for call in range(calls):  # fresh inputs each call; the update is written into them
        state = _state(shapes, 100 + call)
        want = _adam(*state)
        got = cg.fn(*[t.clone() for t in state])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _groups(cg) -> list[KernelGroup]:
    return [w for w in cg.scheduled.launched() if isinstance(w, KernelGroup)]


def _code(cg) -> str:
    return cg.texts["output_code"].split("# ---- kernels ----")[1]


@pytest.mark.parametrize("n_threads", [1, 2])
def test_adam_over_many_sizes_is_one_launch_with_one_parallel_region(n_threads: int) -> None:
    shapes = SHAPES + [(41,), (3, 29), (2, 2, 2)]
    cg = _compile_adam(shapes)
    with threads(n_threads):
        _check_adam(cg, shapes)
    (group,) = _groups(cg)
    kernels = cg.scheduled.kernels()  # every loop nest is still listed, inside the group
    # one kernel per size (the scheduler fuses tensors of one size; empty ones may have none)
    assert len(group.parts) == len(kernels) >= len(shapes) - 2
    assert cg.scheduled.launched() == [group]
    code = _code(cg)
    assert code.count('extern "C" void') == 1
    assert code.count("#pragma omp parallel") == 1
    # one range function serves every 1-d part (length is an argument); n-d parts have their own
    assert code.count("static __attribute__((noinline)) void kiln_range") < len(set(shapes))
    # the wrapper makes one kernel call
    assert cg.texts["output_code"].count("_group0(") == 1 and "_k1_" not in cg.texts["output_code"]


def test_adam_groups_write_every_state_in_place() -> None:
    shapes = [(37,), (13, 7), (257,)]
    cg = _compile_adam(shapes)
    state = _state(shapes, 5)
    want = _adam(*state)
    got = cg.fn(*state)
    n = len(shapes)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    written = state[:n] + state[2 * n:]  # params, exp_avgs, exp_avg_sqs
    assert [t.data_ptr() for t in got] == [t.data_ptr() for t in written]


def test_grouping_matches_ungrouped_code_and_removes_parallel_regions() -> None:
    shapes = [(64, 1031), (40000,), (37,), (13, 7)]
    grouped, plain = _compile_adam(shapes), _compile_adam(shapes, UNGROUPED)
    assert not _groups(plain) and len(_groups(grouped)) == 1
    assert _code(plain).count("#pragma omp parallel") == 2  # the two tensors above the threshold
    assert _code(grouped).count("#pragma omp parallel") == 1
    with threads(2):
        _check_adam(grouped, shapes)
        _check_adam(plain, shapes, calls=1)


@pytest.mark.slow  # 270 tensors: 90 s on the loaded 2-core machine
def test_a_launch_stays_below_the_parameter_limit() -> None:
    shapes = [(7 + k,) for k in range(MAX_PARAMS // 4 + 20)]  # 4 pointers per tensor
    assert 4 * len(shapes) > MAX_PARAMS
    cg = _compile_adam(shapes)
    groups = _groups(cg)
    assert len(groups) == -(-4 * len(shapes) // MAX_PARAMS)  # filled up to the limit: as few regions as it allows
    for g in groups:
        assert sum(len(x) for x in kernel_params(g)) <= MAX_PARAMS
    _check_adam(cg, shapes, calls=3)


def _strided(a: torch.Tensor, b: torch.Tensor, row: torch.Tensor, c: torch.Tensor):
    """Pointwise kernels that cannot be flattened to one dim: a transposed input, a broadcast column,
    a 3-d permute; and one contiguous kernel."""
    return a.t() * 2.0 + 1.0, b + row[:, None], c.permute(2, 0, 1).sin(), (b * b).sum(0).exp()


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("m,n", [(13, 7), (211, 173), (1, 5), (0, 3)])
def test_multi_dim_parts_split_at_any_point(n_threads: int, m: int, n: int) -> None:
    args = [torch.randn(m, n), torch.randn(n, m), torch.randn(n), torch.randn(m, 5, n)]
    cg = compile_graph(trace(_strided, *args), args)
    with threads(n_threads):
        for seed in range(3):
            torch.manual_seed(seed)
            fresh = [torch.randn_like(t) for t in args]
            got = cg.fn(*fresh)
            for a, b in zip(got, _strided(*fresh)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if m > 1 and n > 1:
        parts = [k for g in _groups(cg) for k in g.parts]
        assert any(len(k.outer) >= 2 for k in parts), cg.texts["ir_post_fusion"]


def _to_channels_last(x: torch.Tensor, w: torch.Tensor):
    """A CNN stem's layout copies: an image and a weight, NCHW -> NHWC (3 channels innermost)."""
    cl = torch.channels_last
    return x.contiguous(memory_format=cl) * 1.0, w.contiguous(memory_format=cl) * 1.0


@pytest.mark.parametrize("n_threads", [1, 2])
def test_whole_rows_run_at_the_rows_static_extent(n_threads: int) -> None:
    """A part's whole rows loop with the row's static extent and no division per row; the blocks of a
    parallel run (4096 elements and more) start and end inside rows of 3, which take the other path."""
    args = [torch.randn(5, 3, 67, 41), torch.randn(16, 3, 7, 7)]
    cg = compile_graph(trace(_to_channels_last, *args), args)
    assert len(_groups(cg)) == 1, cg.texts["ir_post_fusion"]
    assert re.search(r"for \(int64_t (x\d) = 0; \1 < 3; \+\+\1\)", _code(cg)), _code(cg)
    with threads(n_threads):
        for seed in range(3):
            torch.manual_seed(seed)
            fresh = [torch.randn_like(t) for t in args]
            for a, b in zip(cg.fn(*fresh), _to_channels_last(*fresh)):
                assert a.stride() == b.stride()
                torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dependent_kernels_are_not_grouped() -> None:
    def f(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = (a * 2.0).exp()
        return b, b.t() * 3.0 + b.t().sin()  # reads b at other points: a second kernel after the first

    a = torch.randn(31, 17)
    cg = compile_graph(trace(f, a), [a])
    for seed in range(3):
        x = torch.randn(31, 17, generator=torch.Generator().manual_seed(seed))
        for got, want in zip(cg.fn(x), f(x)):
            torch.testing.assert_close(got, want)
    for g in _groups(cg):
        written = {b for k in g.parts for b in k.outputs}
        assert not any(b in written for k in g.parts for b in k.inputs if b not in k.outputs)


def test_an_input_written_in_place_is_not_read_by_another_part() -> None:
    """p is updated in place by one kernel and read at other points by another: they must not run at
    once (a write-after-read over the same memory)."""
    def f(p: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (p[:9].flip(0) * 2.0, p - 0.1 * g)

    p, g = torch.randn(64), torch.randn(64)
    gm = trace(f, p, g)
    annotate(gm, GraphAnnotations(input_mutations=((1, 0),)))
    cg = compile_graph(gm, [p, g])
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.randn(64, generator=gen), torch.randn(64, generator=gen)
        want = f(x, y)
        got = cg.fn(x.clone(), y)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert " over arg0" in cg.texts["ir_post_fusion"]  # the case: p is written in place ...
    assert not _groups(cg)  # ... after a kernel reading it, so the two are not run at once


def test_pass_on_a_schedule_keeps_independent_runs_only() -> None:
    shapes = [(37,), (13, 7), (257,)]
    cg = _compile_adam(shapes, UNGROUPED)
    before = cg.scheduled
    after = group_kernels(before)
    assert [k.name for k in after.kernels()] == [k.name for k in before.kernels()]
    (g,) = [w for w in after.launched() if isinstance(w, KernelGroup)]
    assert all(isinstance(k, Kernel) for k in g.parts) and len(g.parts) == len(before.kernels())
    # allocations move to the group's start, frees to its end: none is lost
    assert sorted(a.buffer for st in after.steps for a in st.allocate) == \
        sorted(a.buffer for st in before.steps for a in st.allocate)
    assert sorted(b for st in after.steps for b in st.free) == sorted(b for st in before.steps for b in st.free)


def _three(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    return a * 2.0 + 1.0, b.sigmoid() * b, (c - 0.5).abs()


@pytest.mark.parametrize("n_threads", [1, 2])
def test_symbolic_sizes_group_and_run_at_every_size(n_threads: int) -> None:
    cg = compile_symbolic(_three, torch.randn(40), torch.randn(9, 11), torch.randn(33))
    assert len(_groups(cg)) == 1, cg.texts["ir_post_fusion"]
    assert _code(cg).count("#pragma omp parallel") == 1
    with threads(n_threads):
        for sizes in [(40, (9, 11), 33), (0, (3, 5), 1), (97, (0, 7), 13), (40961, (131, 257), 7)]:
            args = [torch.randn(sizes[0]), torch.randn(*sizes[1]), torch.randn(sizes[2])]
            for got, want in zip(cg.fn(*args), _three(*args)):
                torch.testing.assert_close(got, want)


def test_cpp_wrapper_calls_a_group_by_its_symbol() -> None:
    """kiln.package's C++ wrapper launches a group as the Python wrapper does: one call, one symbol."""
    a, b = torch.randn(37), torch.randn(5, 11)
    slots = {0: Slot("input", 0), 1: Slot("input", 1)}
    p = cpp_program(trace(_two, a, b), [a, b], slots)
    assert p.kernel_source.count('extern "C" void') == 1 and p.n_kernels == 1
    assert p.wrapper_source.count("group0(") == 2  # its declaration and its one call
    assert "#pragma omp parallel" not in p.kernel_source  # 92 elements: one thread, no region


def _two(a: torch.Tensor, b: torch.Tensor):
    return a * 2.0 + 1.0, b.sin()
