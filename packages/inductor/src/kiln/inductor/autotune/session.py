"""One compile's max-autotune: every tuning problem of the program, deduplicated, compiled together
in parallel, then timed serially within a time budget.

A ``Problem`` is one thing to choose for (a matmul site: cuBLAS vs template configurations; a
generated kernel: its launch configurations), keyed by what the choice depends on -- the kernel text
with names numbered, sizes, dtypes, device -- so the twelve identical layers of GPT-2 are one problem
(``uses`` counts the sites sharing it). ``TuningSession.run()``:

1. answers problems from the compile cache (a second process does not re-tune);
2. compiles the candidates of every unanswered problem, matmul templates first, in one parallel
   batch (``compilers.py``, on the one Triton compile pool), including problems only registered for compiling (``wanted=False``:
   the generated kernels before the templates are chosen, timed later if they survive);
3. times the wanted problems one after another, the margin rule keeping the default unless beaten;
4. once ``budget_s`` has passed since the session started, the remaining problems keep their
   defaults (not cached) and one log line says how many.

Without a clock to time on (cross-compiling for ``cross_target``), step 3 is skipped: the report says
how many candidates were compiled and how long it took.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.graph import log

from ..autotune_options import AutotuneOptions
from .compilers import CompileJob, Compiler, CompileStats, NoCompile
from .config import Candidate, Choice, Config
from .tuner import Autotuner


@dataclass
class Problem:
    name: str
    key: str
    kind: str  # "matmul" | "kernel"
    configs: list[Config]  # the default first
    launch: Callable[[Config], Callable[[], object]]  # a launcher per configuration (made lazily)
    jobs: Callable[[], list[CompileJob]]  # what compiling the candidates means (made lazily)
    wanted: bool = True  # timed (else only compiled: it may not survive to the final program)
    uses: int = 1  # sites sharing this problem
    compiled: bool = False
    choice: Choice | None = None
    defaulted: str = ""  # why the default was kept untimed ("budget", "compile-only", error text)

    @property
    def default(self) -> Config:
        return self.configs[0]

    def candidates(self) -> list[Candidate]:
        return [Candidate(c, self.launch(c), is_default=(i == 0)) for i, c in enumerate(self.configs)]


@dataclass
class TuningReport:
    problems: int = 0  # distinct problems
    sites: int = 0  # problems counted once per site (kernels / matmuls of the program)
    cached: int = 0
    timed_problems: int = 0
    timed_candidates: int = 0
    timing_s: float = 0.0
    budget_defaults: int = 0
    compile: CompileStats = field(default_factory=CompileStats)
    candidates: int = 0  # distinct candidates of the problems compiled
    kinds: dict[str, int] = field(default_factory=dict)  # distinct problems by kind ("matmul", "kernel")

    def line(self) -> str:
        c = self.compile
        return (f"{self.sites} tuning sites -> {self.problems} distinct problems ({self.cached} cached); "
                f"{self.candidates} candidates, {c.jobs} compiled in {c.seconds:.1f} s ({c.mode}, {c.workers} "
                f"workers; {c.failed} failed, {c.skipped} skipped); {self.timed_candidates} timed in "
                f"{self.timing_s:.1f} s; {self.budget_defaults} left at defaults by the budget")


class TuningSession:
    def __init__(self, tuner: Autotuner, compiler: Compiler | None = None, *, budget_s: float = 60.0,
                 can_time: bool = True, clock: Callable[[], float] | None = None, console: bool = False,
                 options: AutotuneOptions | None = None) -> None:
        self.tuner = tuner
        self.options = options or AutotuneOptions()
        self.compiler = compiler or NoCompile()
        self.clock = clock or time.perf_counter
        self.budget_s = budget_s
        self.deadline = self.clock() + budget_s
        self.can_time = can_time
        self.console = console
        self.problems: dict[str, Problem] = {}
        self.report = TuningReport()
        self._budget_logged = False

    def add(self, p: Problem, wanted: bool = True) -> Problem:
        """Register a problem; one with the same key already registered is returned instead (shared)."""
        self.report.sites += 1
        have = self.problems.get(p.key)
        if have is not None:
            have.uses += 1
            have.wanted = have.wanted or wanted
            return have
        p.wanted = wanted
        self.problems[p.key] = p
        self.report.problems += 1
        self.report.kinds[p.kind] = self.report.kinds.get(p.kind, 0) + 1
        hit = self.tuner.cached(p.key, p.configs)
        if hit is not None:
            p.choice = hit
            self.report.cached += 1
        return p

    def remaining_s(self) -> float:
        return self.deadline - self.clock()

    def run(self) -> None:
        self._compile([p for p in self.problems.values() if p.choice is None and not p.compiled])
        for p in sorted(self.problems.values(), key=lambda p: p.kind != "matmul"):
            if p.choice is None and p.wanted and not p.defaulted:
                self._time(p)

    def choice(self, p: Problem) -> Choice:
        """``p``'s choice once ``run`` has handled it (the default when it was not timed)."""
        return p.choice if p.choice is not None else Choice(p.default, math.nan, cached=False)

    def _compile(self, todo: list[Problem]) -> None:
        if not todo:
            return
        jobs: list[CompileJob] = []
        for p in sorted(todo, key=lambda p: p.kind != "matmul"):  # templates first: the budget cuts the rest
            try:
                jobs += p.jobs()
            except Exception as e:  # noqa: BLE001 - the candidates then compile (and fail) when timed
                log("perf_hints").info("max-autotune: %s: preparing its compile failed: %s: %s", p.name,
                                       type(e).__name__, e)
            p.compiled = True
            self.report.candidates += len(p.configs)
        stats = self.compiler(jobs, self.deadline)
        self.report.compile.add(stats)
        log("perf_hints").info("max-autotune: compiled %d candidate kernels of %d problems in %.2f s (%s, %d "
                               "threads)", stats.jobs, len(todo), stats.seconds, stats.mode, stats.workers)

    def _time(self, p: Problem) -> None:
        if not self.can_time:
            p.defaulted = "compile-only"
            return
        if len(p.configs) == 1:  # nothing to choose between
            p.choice = Choice(p.default, math.nan, cached=False)
            return
        if self.clock() > self.deadline:
            p.defaulted = "budget"
            self.report.budget_defaults += 1
            return
        t0 = time.perf_counter()
        try:
            p.choice = self.tuner.measure(p.name, p.key, p.candidates())
            self.report.timed_problems += 1
            self.report.timed_candidates += len(p.configs)
        except Exception as e:  # noqa: BLE001 - tuning is an optimisation: the default stays, loudly
            p.defaulted = f"{type(e).__name__}: {e}" or "failed"
            log("perf_hints").warning("max-autotune: tuning %s failed, it keeps its default: %s", p.name,
                                      p.defaulted)
        self.report.timing_s += time.perf_counter() - t0

    def _log_budget(self) -> None:
        left = [p for p in self.problems.values() if p.defaulted == "budget"]
        if left and not self._budget_logged:
            self._budget_logged = True
            msg = (f"max-autotune: the tuning budget of {self.budget_s:.0f} s (KILN_AUTOTUNE_BUDGET_S) is spent: "
                   f"{len(left)} of {len(self.problems)} problems keep their defaults (cuBLAS / heuristic "
                   f"launch configurations), e.g. {', '.join(p.name for p in left[:3])}")
            log("perf_hints").warning("%s", msg)
            if self.console:
                print(f"kiln {msg}", file=sys.stderr)

    def finish(self) -> TuningReport:
        """Log the summary (``perf_hints``; stderr with progress on); the report is returned."""
        self._log_budget()
        close = getattr(self.compiler, "close", None)
        if close is not None:
            close()  # worker processes are not kept past the compile
        line = self.report.line()
        log("perf_hints").info("max-autotune: %s", line, extra={"kiln_autotune_report": self.report})
        if self.console and (self.report.timed_candidates or self.report.compile.jobs):
            print(f"kiln max-autotune: {line}", file=sys.stderr)
        return self.report


def problem_summary(problems: Sequence[Problem]) -> dict[str, int]:
    """How many problems of each kind (for reports and tests)."""
    out: dict[str, int] = {}
    for p in problems:
        out[p.kind] = out.get(p.kind, 0) + 1
    return out
