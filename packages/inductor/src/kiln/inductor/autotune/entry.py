"""Entry points for the inductor backend under max-autotune: build a tuner or a compile's tuning
session from options, tune a program's generated kernels from its layouts, and tune an extern matmul
site by its sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from ..autotune_options import AutotuneOptions
from ..compile_pool import device_target, parse_target
from ..knobs import triton_interpret
from .cache import AutotuneCache
from .compilers import (
    Compiler,
    DeviceCompiler,
    NoCompile,
    PoolCompiler,
    TargetCompiler,
)
from .kernels import buffers_for, tune_program
from .matmul import NONE, Epilogue, TunedMatmul, mm_configs, tuned_mm
from .progress import ConsoleProgress, LogProgress
from .session import TuningSession
from .timing import DeviceTimer
from .tuner import Autotuner

DEFAULT_OPTIONS = AutotuneOptions()


def make_tuner(options: AutotuneOptions = DEFAULT_OPTIONS, cache: AutotuneCache | None = None) -> Autotuner:
    progress = ConsoleProgress() if options.progress else LogProgress()
    timer = options.timer if options.timer is not None else DeviceTimer()
    cache = cache if cache is not None else AutotuneCache(options.cache_root)
    return Autotuner(timer, cache, progress, options.margin)  # type: ignore[arg-type]


def autotune_program(kernels: Any, layouts: Mapping[str, Any], sizes: Mapping[str, int] | None,
                     device: torch.device | str, *, tuner: Autotuner | None = None,
                     options: AutotuneOptions = DEFAULT_OPTIONS) -> list[Any]:
    """Tuned descriptions of ``kernels.generated`` (a codegen.triton ``TritonKernels``), benchmarked
    on fresh buffers shaped by ``layouts`` (name -> ir.Layout) with ``sizes`` bound."""
    tuner = tuner or make_tuner(options)
    return tune_program(kernels, buffers_for(layouts, sizes, device), sizes, tuner=tuner)


def autotune_mm(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device | str, *,
                epilogue: Epilogue = NONE, tuner: Autotuner | None = None,
                options: AutotuneOptions = DEFAULT_OPTIONS) -> TunedMatmul:
    """Choose between cuBLAS and the Triton template for an (m, k) @ (k, n) site (with its fused
    epilogue), on random operands; the result runs any operands of those sizes."""
    tuner = tuner or make_tuner(options)
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    extra = [torch.randn(n, device=device).to(dtype) for _ in epilogue.params]
    return tuned_mm(a, b, tuner=tuner, epilogue=epilogue, epilogue_args=extra,
                    configs=mm_configs(m, n, k, limit=options.matmul_configs))


def _interpreter() -> bool:
    return triton_interpret()


def make_session(options: AutotuneOptions, device: str) -> TuningSession | None:
    """The max-autotune session of one compile for kernels on ``device``, or None when there is
    nothing to do it with: no CUDA device, no test timer, and no ``cross_target`` to compile for.

    - a CUDA device: candidates compiled on the compile pool's worker processes, timed on the device;
    - ``options.timer`` (tests, under the Triton interpreter): nothing to compile, timed by it;
    - no device but ``options.cross_target`` (``KILN_AUTOTUNE_CROSS_TARGET=cuda:90``): every candidate
      compiled for that target, nothing timed (defaults kept): what tuning would cost, measured.
    """
    on_device = device == "cuda" and torch.cuda.is_available() and not _interpreter()
    compiler = options.compiler
    if options.timer is not None or on_device:
        timer = options.timer if options.timer is not None else DeviceTimer()
        if compiler is None:
            compiler = _compiler(options, "") if on_device else NoCompile()
        can_time = True
    elif options.cross_target:
        timer = DeviceTimer()  # never called: compile-only
        compiler = compiler if compiler is not None else _compiler(options, options.cross_target)
        can_time = False
    else:
        return None
    tuner = make_tuner(replace(options, timer=timer))
    return TuningSession(tuner, compiler, budget_s=options.budget_s, can_time=can_time,  # type: ignore[arg-type]
                         clock=options.clock, console=options.progress, options=options)  # type: ignore[arg-type]


def _compiler(options: AutotuneOptions, target: str) -> Compiler:
    """The one Triton compile pool (compile_pool.py) with the in-process thread compiler as its fallback."""
    threads: Compiler = TargetCompiler(target) if target else DeviceCompiler()
    named = parse_target(target, "KILN_AUTOTUNE_CROSS_TARGET") if target else device_target()
    return PoolCompiler(named, threads) if named is not None else threads


DIRECT_KERNEL_CONFIGS = 8  # autotune_kernels called directly tunes configs (the pipeline's default: 1)


def session_for_tuner(tuner: Autotuner | None, device: str) -> TuningSession:
    """A session around an existing tuner (direct use and tests of ``autotune_kernels``)."""
    on_device = device == "cuda" and torch.cuda.is_available() and not _interpreter()
    options = replace(DEFAULT_OPTIONS, kernel_configs=DIRECT_KERNEL_CONFIGS)
    return TuningSession(tuner or make_tuner(), DeviceCompiler() if on_device else NoCompile(),
                         budget_s=options.budget_s, options=options)
