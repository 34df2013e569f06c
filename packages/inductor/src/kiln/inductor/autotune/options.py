"""Options of max-autotune, one frozen value passed down; and what each compile mode turns on."""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True, slots=True)
class AutotuneOptions:
    kernel_configs: int = 24  # most configurations benchmarked per generated kernel
    matmul_configs: int | None = None  # most template configurations per matmul (None: all)
    margin: float = 0.02  # a tuned choice must beat the default by this fraction to replace it
    progress: bool = True  # a line per tuned kernel on stderr
    matmul_templates: bool = True  # mm/addmm/bmm compete with a Triton template (epilogue fused)
    # where results are cached: a kiln.runtime CompileCache root (None: KILN_CACHE_DIR's cache)
    cache_root: str | None = None
    # what measures a candidate: None is the device timer; tests pass a FakeTimer (which also lets the
    # Triton interpreter stand in for a device). Not part of the options' identity.
    timer: object | None = field(default=None, compare=False, repr=False)


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
