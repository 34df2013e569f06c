"""Persistent row kernels that store per-row results only (one-row matmuls, row sums): two rows of 1,024
a program at four warps, and their unpredicated row loads issued before anything else is computed
(``TritonConfig.row_stream_elems``, ``KernelWriter.issue_row_loads``), so a one-row matmul's weights are in
flight while it reduces the RMSNorm statistic of its vector. Kernels storing whole rows keep their blocks.
Compared with eager over fresh inputs; under the interpreter on CPU here, on the GPU there (conftest.py)."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device

OPTIONS = InductorOptions(cpu_backend="triton")


def _rand(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device(), dtype=dtype)


def _mlp(x: torch.Tensor, res: torch.Tensor, wn: torch.Tensor, w1: torch.Tensor,
         w3: torch.Tensor) -> tuple[torch.Tensor]:
    # decode's MLP: the RMSNorm of the residual sum, read by the gate and up matmuls of one row
    h = x + res
    h32 = h.float()
    n = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * wn
    return (F.silu(F.linear(n, w1)) * F.linear(n, w3),)


def _launches(code: str) -> dict[str, tuple[str, str, int]]:
    """launcher -> (kernel function, its constants, warps)."""
    found = re.findall(r"^_launch_(\w+) = _KilnLaunch\(triton_kernels\.(\w+), (\{[^}]*\}), (\d+)", code, re.M)
    return {name: (fn, consts, int(warps)) for name, fn, consts, warps in found}


def _function(code: str, name: str) -> str:
    start = code.index(f"def {name}(")
    end = code.find("\n\n\n", start)
    return code[start:end if end > 0 else None]


def _compile(f, args):  # noqa: ANN001, ANN202
    cg = compile_graph(trace(f, *args), args, options=OPTIONS)
    return cg, cg.texts["output_code"]


def test_one_row_matmul_takes_two_rows_at_four_warps_and_loads_its_weights_first() -> None:
    shapes = [(1, 1024), (1, 1024), (1024,), (48, 1024), (48, 1024)]
    args = [_rand(i, *s, dtype=torch.bfloat16) for i, s in enumerate(shapes)]
    cg, code = _compile(_mlp, args)
    matmuls = [(fn, consts, warps) for fn, consts, warps in _launches(code).values()
               if _function(code, fn).count("tl.sum(") == 3]  # the statistic, the gate, the up projection
    assert len(matmuls) == 1, _launches(code)
    fn, consts, warps = matmuls[0]
    assert (consts, warps) == ("{'XBLOCK': 2, 'RBLOCK': 1024}", 4)
    body = _function(code, fn)
    weights = [m.start() for m in re.finditer(r"tl\.load\(\w+ \+ \(r0 \+ 1024\*x0\)", body)]
    assert len(weights) == 2 and max(weights) < body.index("tl.sum(")  # both weights before the statistic
    for call in range(3):
        fresh = [_rand(10 * call + i + 7, *s, dtype=torch.bfloat16) * (call + 1) for i, s in enumerate(shapes)]
        got, want = cg.fn(*fresh)[0], _mlp(*fresh)[0]
        scale = float(want.float().abs().max())
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2 * scale, rtol=2e-2)


def test_a_kernel_storing_whole_rows_keeps_its_blocks() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.softmax(x, -1),)

    x = _rand(0, 64, 1024)
    cg, code = _compile(f, [x])
    (fn, consts, warps), = _launches(code).values()
    assert (consts, warps) == ("{'XBLOCK': 8, 'RBLOCK': 1024}", 8)
    for call in range(2):
        fresh = _rand(call + 1, 64, 1024) * (call + 2)
        torch.testing.assert_close(cg.fn(fresh)[0], f(fresh)[0])


def test_row_sums_with_a_predicated_load_match_eager() -> None:
    # the load of ``w`` runs under the mask (a predicated where): it is not issued ahead of the mask
    def f(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.where(m, w, 0.0) * x).sum(-1), (w * x).sum(-1)

    shapes = [(1, 512), (40, 512)]
    args = [_rand(i, *s) for i, s in enumerate(shapes)] + [_rand(5, 40, 512) > 0]
    cg, code = _compile(f, args)
    assert all(warps == 4 for _, _, warps in _launches(code).values())
    for call in range(3):
        fresh = [_rand(20 + call + i, *s) for i, s in enumerate(shapes)] + [_rand(30 + call, 40, 512) > 0.5 * call]
        for got, want in zip(cg.fn(*fresh), f(*fresh)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
