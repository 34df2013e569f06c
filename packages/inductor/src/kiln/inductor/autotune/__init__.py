"""kiln's max-autotune: benchmark launch configurations on the device and keep the fastest, cached in kiln.runtime's compile cache.

- ``Autotuner(timer, cache, progress).select(name, key, candidates)``: the core, over ``Candidate``s
  (a ``Config`` and a launch callable); ``FakeTimer`` makes it testable without a GPU.
- ``tune_kernel`` / ``tune_program``: configurations of kiln's generated Triton kernels;
  ``GeneratedKernelTuner`` (generated.py): the tuner a compile hands to the Triton backend.
- ``tuned_mm``: a Triton matmul template with fused epilogues, competing with cuBLAS (standalone).
- ``matmul_template_kernel``: the pipeline's matmul template (mm/addmm/bmm with the consuming pointwise kernel
  fused), chosen against cuBLAS by the ``matmul_templates`` pass (kiln/inductor/matmul_templates.py).
- ``TuningSession`` (``make_session``): one compile's tuning -- problems deduplicated by key, every
  candidate compiled in parallel first (on the one Triton compile pool, ``compilers.py``), then timed serially within a budget.
- ``mode_flags(mode)``: what "max-autotune" / "max-autotune-no-cudagraphs" / "reduce-overhead" turn on.
"""

from ..autotune_options import MODES, AutotuneOptions, ModeFlags, mode_flags
from .cache import AutotuneCache, tune_key
from .compilers import (
    CompileJob,
    CompileStats,
    DeviceCompiler,
    NoCompile,
    PoolCompiler,
    TargetCompiler,
)
from .config import Candidate, Choice, Config
from .entry import autotune_mm, autotune_program, make_session, make_tuner
from .generated import GeneratedKernelTuner, autotune_kernels, kernel_problems
from .kernels import (
    apply_config,
    buffers_for,
    default_config,
    kernel_configs,
    kernel_problem,
    normalized_source,
    random_buffer,
    tune_kernel,
    tune_program,
)
from .matmul import (
    BIAS,
    BIAS_GELU,
    BIAS_RELU,
    EPILOGUES,
    NONE,
    RELU,
    Epilogue,
    TunedMatmul,
    mm_configs,
    template_source,
    tuned_mm,
)
from .progress import ConsoleProgress, LogProgress, Progress
from .session import Problem, TuningReport, TuningSession
from .timing import DeviceTimer, FakeTimer, Timer
from .tuner import Autotuner, NoViableCandidate

__all__ = [
    "BIAS", "BIAS_GELU", "BIAS_RELU", "EPILOGUES", "MODES", "NONE", "RELU", "AutotuneCache", "AutotuneOptions",
    "Autotuner", "Candidate", "Choice", "Config", "ConsoleProgress", "DeviceTimer", "Epilogue", "FakeTimer",
    "LogProgress", "ModeFlags", "NoViableCandidate", "Progress", "Timer", "TunedMatmul", "apply_config", "autotune_mm", "autotune_program", "buffers_for", "make_tuner",
    "default_config", "kernel_configs", "mm_configs", "mode_flags", "random_buffer",
    "template_source", "tune_kernel", "tune_key", "tune_program", "tuned_mm",
    "CompileJob", "CompileStats", "DeviceCompiler", "NoCompile", "PoolCompiler", "TargetCompiler", "Problem", "TuningReport",
    "TuningSession", "kernel_problem", "make_session", "normalized_source",
    "GeneratedKernelTuner", "autotune_kernels", "kernel_problems",
]
