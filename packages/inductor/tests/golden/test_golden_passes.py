"""Golden pass tests: each file under golden/<pass>/ is an input loop program (text, read back with
``ir.parse_program``) and what the pass must make of it. ``--update-golden`` rewrites the expected parts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from golden_programs import corpus

from kiln.graph import check_golden
from kiln.inductor import InductorOptions
from kiln.inductor.codegen.cpp import unique_kernel_sources
from kiln.inductor.codegen.cpp.kernel import kernel_source
from kiln.inductor.codegen.triton.kernel import generate_kernels
from kiln.inductor.ir import parse_program, verify_program, verify_schedule
from kiln.inductor.scheduler import eliminate_dead_code, schedule
from kiln.inductor.scheduler.horizontal import group_kernels
from kiln.inductor.scheduler.inplace import plan_inplace_reuse
from kiln.inductor.split_reductions import split_reductions

HERE = Path(__file__).parent


def _dead_code(text: str) -> str:
    out = eliminate_dead_code(parse_program(text))
    verify_program(out)
    return out.as_text()


def _split(text: str) -> str:
    out, count = split_reductions(parse_program(text))
    verify_program(out)
    return f"# {count} reduction(s) split\n{out.as_text()}"


def _schedule(text: str) -> str:
    out = schedule(parse_program(text), InductorOptions())
    verify_schedule(out)
    return out.as_text()


def _inplace_reuse(text: str) -> str:
    out = plan_inplace_reuse(schedule(parse_program(text), InductorOptions()))
    verify_schedule(out)
    return out.as_text()


def _group(text: str) -> str:
    program = parse_program(text)
    out = group_kernels(schedule(program, InductorOptions()))
    verify_schedule(out)
    bodies, _ = unique_kernel_sources(out.launched(), program.layouts(), InductorOptions())
    return out.as_text() + "\n\n" + "\n\n".join(bodies)


def _cpp(text: str) -> str:
    program = parse_program(text)
    sched = schedule(program, InductorOptions())
    layouts = program.layouts()
    return "\n\n".join(kernel_source(k, layouts, InductorOptions()) for k in sched.kernels())


def _triton(text: str) -> str:
    sched = schedule(parse_program(text, device="cuda"), InductorOptions())
    parts = []
    for k in sched.kernels():
        for t in generate_kernels(k):
            parts.append(f"# {t.name}: {t.kind}, grid {t.grid}, XBLOCK={t.xblock} RBLOCK={t.rblock} "
                         f"num_warps={t.num_warps}, args {', '.join(t.pointer_args + t.size_args)}\n{t.source}")
    return "\n\n".join(parts)


# pass -> (what it is, how to run it, the corpus programs it is tested on)
PASSES: dict[str, tuple[str, Callable[[str], str], tuple[str, ...]]] = {
    "remove_dead_code": ("scheduler.eliminate_dead_code: nodes whose values reach no output are dropped",
                         _dead_code, ("dead_values", "sum_max_argmax")),
    "split_reductions": ("split_reductions: long few-output reductions become a partial and a final pass",
                         _split, ("batch_norm_stats", "sum_max_argmax")),
    "schedule": ("scheduler.schedule: fusion into kernels, loop order, memory planning (CPU options)",
                 _schedule, ("pointwise", "softmax", "layer_norm", "transpose_reshape", "split_merge_dims",
                             "cumsum", "embedding", "index_add", "cat_pad", "matmul_epilogue", "dropout")),
    "inplace_reuse": ("scheduler.inplace.plan_inplace_reuse after schedule: a pointwise kernel writes over an "
                      "input that dies in it", _inplace_reuse, ("linear_gelu", "layer_norm", "int_and_casts")),
    "group_kernels": ("scheduler.horizontal.group_kernels after schedule, and the C++ of what is launched: "
                      "independent pointwise kernels as one group over their flattened ranges",
                      _group, ("independent_updates", "pointwise")),
    "codegen_cpp": ("codegen.cpp.kernel_source after schedule: each kernel's C++/OpenMP source",
                    _cpp, ("pointwise", "softmax", "layer_norm", "embedding", "cumsum")),
    "codegen_triton": ("codegen.triton.generate_kernels after schedule (CUDA layouts): each kernel's Triton source "
                       "and launch", _triton, ("pointwise", "softmax", "layer_norm", "embedding", "index_add")),
}
CASES = [(p, c) for p, (_, _, cases) in PASSES.items() for c in cases]


@pytest.fixture(scope="module")
def programs():
    return corpus()


@pytest.mark.parametrize(("pass_name", "case"), CASES, ids=[f"{p}-{c}" for p, c in CASES])
def test_golden_pass(pass_name: str, case: str, programs, request) -> None:
    describe, run, _ = PASSES[pass_name]
    update = request.config.getoption("--update-golden")
    path = HERE / pass_name / f"{case}.txt"
    # a new file takes the input lowering makes now (golden_programs.py); after that the stored text is
    # the input (some are written by hand), so a lowering change does not fail these pass tests. Delete a
    # file and run with --update-golden to take a fresh input.
    check_golden(path, run, describe=describe, update=update,
                 input=None if path.exists() else programs[case].as_text())


def test_every_golden_file_is_a_listed_case() -> None:
    on_disk = {(p.parent.name, p.stem) for p in HERE.glob("*/*.txt") if p.parent.name not in ("graph_passes", "lowering", "decompose")}
    assert on_disk <= set(CASES), f"golden files without a test: {sorted(on_disk - set(CASES))}"
