"""A Triton matmul template with a fused pointwise epilogue, tuned against the cuBLAS extern.

``tuned_mm(a, b, epilogue=BIAS_RELU, epilogue_args=(bias,), tuner=...)`` benchmarks the extern
(``torch.mm``/``torch.addmm`` plus the epilogue in ATen) and the template over block sizes, warps and
stages, and returns a ``TunedMatmul`` callable that runs the winner. The extern is the default: the
template is chosen only when it is faster (by the tuner's margin). An ``Epilogue`` is a few lines of
Triton over ``acc`` (fp32, ``[BLOCK_M, BLOCK_N]``), ``rm``/``rn`` (row/column indices) and ``mask``,
plus the same computation in torch for the extern and for checking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.runtime import load_triton_module

from .cache import tune_key
from .config import Candidate, Choice, Config
from .tuner import Autotuner


@dataclass(frozen=True)
class Epilogue:
    name: str
    params: tuple[str, ...]  # extra pointer arguments, in order (e.g. ("BIAS",))
    code: str  # Triton lines updating ``acc``
    torch_fn: Callable[..., torch.Tensor]  # (mm_result, *args) -> result, for the extern and for checks
    addmm_bias: bool = False  # the extern folds the row-vector bias into cuBLAS (torch.addmm) ...
    activation: Callable[[torch.Tensor], torch.Tensor] | None = None  # ... then applies this in ATen


_BIAS = "acc = acc + tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]"
NONE = Epilogue("none", (), "", lambda x: x)
RELU = Epilogue("relu", (), "acc = tl.maximum(acc, 0.0)", torch.relu)
BIAS = Epilogue("bias", ("BIAS",), _BIAS, lambda x, b: x + b, addmm_bias=True)
BIAS_RELU = Epilogue("bias_relu", ("BIAS",), _BIAS + "\n    acc = tl.maximum(acc, 0.0)",
                     lambda x, b: torch.relu(x + b), addmm_bias=True, activation=torch.relu_)
BIAS_GELU = Epilogue("bias_gelu", ("BIAS",),
                     _BIAS + "\n    acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))",
                     lambda x, b: torch.nn.functional.gelu(x + b), addmm_bias=True,
                     activation=lambda t: t.copy_(torch.nn.functional.gelu(t)))
EPILOGUES = {e.name: e for e in (NONE, RELU, BIAS, BIAS_RELU, BIAS_GELU)}

_TEMPLATE = '''\
import triton
import triton.language as tl


@triton.jit
def kiln_mm(A, B, C, {params}M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row-blocks share B tiles in L2
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b{dot_kwargs})
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    {epilogue}
    c_ptrs = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
'''


def template_source(epilogue: Epilogue, dtype: torch.dtype) -> str:
    # fp32 inputs: match torch.mm's precision setting (tf32 only when torch allows it)
    dot = ""
    if dtype == torch.float32:
        dot = ', input_precision="tf32"' if torch.backends.cuda.matmul.allow_tf32 else ', input_precision="ieee"'
    params = "".join(f"{p}, " for p in epilogue.params)
    return _TEMPLATE.format(params=params, dot_kwargs=dot, epilogue=epilogue.code or "pass")


def _p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): shapes that do well on Hopper/Ampere for common sizes
_MM_CONFIGS = [
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4), (128, 128, 32, 4, 4), (64, 64, 32, 4, 5), (32, 64, 64, 4, 4), (16, 64, 128, 4, 3),
    (16, 128, 64, 4, 4), (32, 32, 128, 4, 3), (16, 32, 256, 4, 3),
]


def mm_configs(m: int, n: int, k: int, limit: int | None = None) -> list[Config]:
    """Template configurations for an (m, k) @ (k, n) product, blocks clipped to the problem."""
    seen: list[Config] = []
    for bm, bn, bk, w, s in _MM_CONFIGS:
        bm, bn, bk = min(bm, max(16, _p2(m))), min(bn, max(16, _p2(n))), min(bk, max(16, _p2(k)))
        c = Config.make(num_warps=w, num_stages=s, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
        if c not in seen:
            seen.append(c)
    return seen[:limit] if limit else seen


class TunedMatmul:
    """``(a, b, *epilogue_args) -> epilogue(a @ b)`` with the chosen implementation."""

    def __init__(self, epilogue: Epilogue, config: Config, dtype: torch.dtype, choice: Choice | None = None):
        self.epilogue = epilogue
        self.config = config
        self.choice = choice
        self._kernel = None if config.extern else load_triton_module(template_source(epilogue, dtype)).kiln_mm

    @property
    def uses_template(self) -> bool:
        return not self.config.extern

    def __call__(self, a: torch.Tensor, b: torch.Tensor, *args: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        if self._kernel is None:
            return _extern(self.epilogue, a, b, args, out)
        return _launch_template(self._kernel, self.config, a, b, args, out)


def _extern(epilogue: Epilogue, a: torch.Tensor, b: torch.Tensor, args: Sequence[torch.Tensor],
            out: torch.Tensor) -> torch.Tensor:
    if epilogue.addmm_bias:
        torch.addmm(args[0], a, b, out=out)
        if epilogue.activation is not None:
            epilogue.activation(out)
        return out
    torch.mm(a, b, out=out)
    if epilogue is NONE:
        return out
    return out.copy_(epilogue.torch_fn(out, *args))


def _launch_template(kernel: Any, config: Config, a: torch.Tensor, b: torch.Tensor,
                     args: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    import triton

    m, k = a.shape
    n = b.shape[1]
    bm, bn = config.get("BLOCK_M"), config.get("BLOCK_N")
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), 1, 1)
    kernel[grid](a, b, out, *args, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 out.stride(0), out.stride(1), **dict(config.constants), num_warps=config.num_warps,
                 num_stages=config.num_stages)
    return out


def mm_candidates(a: torch.Tensor, b: torch.Tensor, epilogue: Epilogue, args: Sequence[torch.Tensor],
                  out: torch.Tensor, configs: Sequence[Config]) -> list[Candidate]:
    extern = Config(extern="cublas")
    cands = [Candidate(extern, lambda: _extern(epilogue, a, b, args, out), is_default=True)]
    kernel = load_triton_module(template_source(epilogue, a.dtype)).kiln_mm
    def launcher(c: Config) -> Callable[[], object]:
        return lambda: _launch_template(kernel, c, a, b, args, out)

    cands.extend(Candidate(c, launcher(c)) for c in configs)
    return cands


def tuned_mm(a: torch.Tensor, b: torch.Tensor, *, tuner: Autotuner, epilogue: Epilogue = NONE,
             epilogue_args: Sequence[torch.Tensor] = (), configs: Sequence[Config] | None = None,
             device_name: str | None = None) -> TunedMatmul:
    """Tune ``epilogue(a @ b)`` for these sizes/dtypes on this device; the result is reusable for
    any operands of the same sizes and dtypes."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"tuned_mm expects (m, k) @ (k, n) matrices, got {tuple(a.shape)} @ {tuple(b.shape)}")
    m, k = a.shape
    n = b.shape[1]
    configs = list(configs) if configs is not None else mm_configs(m, n, k)
    device = device_name or (torch.cuda.get_device_name(a.device) if a.is_cuda else str(a.device))
    source = template_source(epilogue, a.dtype)
    key = tune_key(source + "\n#configs " + ";".join(c.label for c in configs), device, (m, n, k),
                   (a.dtype, b.dtype, a.stride(), b.stride(), *(x.dtype for x in epilogue_args)))
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    name = f"mm_{epilogue.name}_{m}x{k}x{n}"
    choice = tuner.select(name, key, mm_candidates(a, b, epilogue, epilogue_args, out, configs))
    return TunedMatmul(epilogue, choice.config, a.dtype, choice)
