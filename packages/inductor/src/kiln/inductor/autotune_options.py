"""Options of max-autotune (one frozen value, part of InductorOptions), and what each compile mode turns on.

A module of its own beside options.py: InductorOptions holds these, and code generation imports
InductorOptions, so they must not live inside the autotune package (which builds on codegen)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .knobs import KNOBS

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True, slots=True)
class AutotuneOptions:
    # most configurations benchmarked per generated kernel (the default included). 1 = generated
    # kernels keep their heuristic configuration: configurations timed alone did not hold up in the
    # whole program (GPT-2 inference ran slower than default mode), so config tuning is opt-in until
    # that is understood
    kernel_configs: int = 1
    matmul_configs: int | None = None  # most template configurations per matmul (None: all that fit)
    margin: float = 0.03  # a tuned choice must take < (1 - margin) of the default's time to replace it
    # seconds one compile may spend tuning (compiling candidates and timing them); after it, choices
    # not yet made keep their defaults (cuBLAS, the heuristic launch config) and a log line says so
    budget_s: float = KNOBS.autotune_budget_s
    # without a device: compile every candidate for this target ("cuda:90") and report; nothing is timed
    cross_target: str = KNOBS.autotune_cross_target
    progress: bool = True  # a line per tuned kernel on stderr
    matmul_templates: bool = True  # mm/addmm/bmm compete with a Triton template (epilogue fused)
    # where results are cached: a kiln.runtime CompileCache root (None: KILN_CACHE_DIR's cache)
    cache_root: str | None = None
    # what measures a candidate: None is the device timer; tests pass a FakeTimer (which also lets the
    # Triton interpreter stand in for a device). Not part of the options' identity.
    timer: object | None = field(default=None, compare=False, repr=False)
    # what compiles the candidates before timing (autotune/compilers.py); None: chosen by device
    compiler: object | None = field(default=None, compare=False, repr=False)
    # the clock the budget is measured on (tests pass a fake one)
    clock: object | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ModeFlags:
    cudagraphs: bool
    autotune: bool


def mode_flags(mode: str | None) -> ModeFlags:
    """What a ``kiln.compile(mode=...)`` string turns on, as torch.compile defines the modes."""
    m = mode or "default"
    if m not in MODES:
        raise ValueError(f"unknown mode {mode!r}; kiln supports {', '.join(MODES)}")
    return ModeFlags(cudagraphs=m in ("reduce-overhead", "max-autotune"),
                     autotune=m in ("max-autotune", "max-autotune-no-cudagraphs"))
