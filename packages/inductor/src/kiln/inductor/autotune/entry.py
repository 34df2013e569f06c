"""Entry points for the inductor backend under max-autotune: build a tuner from options, tune a
program's generated kernels from its layouts, and tune an extern matmul site by its sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .cache import AutotuneCache
from .kernels import buffers_for, tune_program
from .matmul import NONE, Epilogue, TunedMatmul, mm_configs, tuned_mm
from .options import AutotuneOptions
from .progress import ConsoleProgress, LogProgress
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
