"""Vendor kernels traced as their portable ATen equivalents (always on, whatever the decomposition table).

Why: on CUDA, ``batch_norm`` dispatches to ``cudnn_batch_norm`` (or ``miopen_batch_norm`` on ROCm). It
writes the running statistics without saying so in its schema (so it cannot be functionalized from
the schema), and its backward, ``cudnn_batch_norm_backward``, needs cuDNN's ``reserveSpace`` from the
very same forward call. The tracer turns cuDNN off while tracing, so these normally never appear;
when they do (cuDNN re-enabled inside the model, an ATen-level graph), they become the native batch
norm ops, whose functional forms and backward are device-independent:

- ``cudnn_batch_norm`` / ``miopen_batch_norm`` -> ``_native_batch_norm_legit`` (training, with running
  stats: functionalized into ``_native_batch_norm_legit_functional`` and written back),
  ``_native_batch_norm_legit.no_stats`` or ``_native_batch_norm_legit_no_training``; cuDNN's
  ``reserveSpace`` output becomes an empty byte tensor;
- ``cudnn_batch_norm_backward`` / ``miopen_batch_norm_backward`` -> ``native_batch_norm_backward``
  (the saved mean and inverse std of both kernels mean the same thing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _native_bn(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
               momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if running_mean is None or running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if training:
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var,
                                                     True, momentum, eps)
    return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean,
                                                             running_var, momentum, eps)


def cudnn_batch_norm(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                     training: bool, exponential_average_factor: float,
                     epsilon: float) -> tuple[torch.Tensor, ...]:
    out, mean, invstd = _native_bn(input, weight, bias, running_mean, running_var, training,
                                   exponential_average_factor, epsilon)
    reserve = aten.empty.memory_format([0], dtype=torch.uint8, device=input.device)
    return out, mean, invstd, reserve


def miopen_batch_norm(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                      training: bool, exponential_average_factor: float,
                      epsilon: float) -> tuple[torch.Tensor, ...]:
    return _native_bn(input, weight, bias, running_mean, running_var, training,
                      exponential_average_factor, epsilon)


def batch_norm_backward(input: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor,
                        running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                        save_mean: torch.Tensor | None, save_var: torch.Tensor | None, epsilon: float,
                        reserve: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    # autograd calls the vendor backward only for training-mode forwards (derivatives.yaml)
    return aten.native_batch_norm_backward.default(grad_output, input, weight, running_mean, running_var,
                                                   save_mean, save_var, True, epsilon, [True, True, True])


VENDOR_REWRITES: dict[Any, Callable[..., Any]] = {
    aten.cudnn_batch_norm.default: cudnn_batch_norm,
    aten.cudnn_batch_norm_backward.default: batch_norm_backward,
    aten.miopen_batch_norm.default: miopen_batch_norm,
    aten.miopen_batch_norm_backward.default: batch_norm_backward,
}
