"""A tuned launch configuration is the one the program launches, on a grid made for it.

Regression test for max-autotune's wrong results on the H200 (6 x LayerNorm -> linear+gelu -> linear +
residual, bf16): the wrapper's launch lines were written from each kernel's heuristic XBLOCK before
the session tuned it, so a kernel tuned to a smaller XBLOCK ran on too few programs (rows left
unwritten) while its launcher used the tuned block. Here a timer that makes the smallest blocks win
(and the templates beat cuBLAS) reproduces it on CPU under the Triton interpreter.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from helpers import transformer_blocks as block
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.autotune import AutotuneOptions, FakeTimer

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


class SmallBlocksWin(FakeTimer):
    """cuBLAS 1.0; a template 0.5; a generated kernel's configuration costs its XBLOCK (smaller wins:
    the tuned block is then below the heuristic one, which is where a stale grid loses rows)."""

    def __init__(self) -> None:
        super().__init__({})

    def __call__(self, launch, label):  # type: ignore[override]
        launch()
        self.timed.append(label)
        if label == "cublas":
            return 1.0
        if "BLOCK_M" in label:
            return 0.5
        consts = dict(kv.split("=") for kv in label.split(",") if "=" in kv)
        return float(consts["XBLOCK"]) + 0.01 * float(consts["warps"])


def block_args(n: int, d: int, tokens: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(tokens, d, generator=g).to(DEV, dtype)]
    for _ in range(n):
        args += [(torch.randn(4 * d, d, generator=g) * 0.05).to(DEV, dtype), torch.randn(4 * d, generator=g).to(DEV, dtype),
                 (torch.randn(d, 4 * d, generator=g) * 0.05).to(DEV, dtype), torch.randn(d, generator=g).to(DEV, dtype)]
    return args


_LAUNCHER = re.compile(r"^(_launch_\w+) = _KilnLaunch\(triton_kernels\.(\w+), (\{[^}]*\})", re.M)


def launch_grids(src: str) -> list[tuple[str, int, int, int]]:
    """(kernel, XBLOCK its launcher uses, xnumel, grid x of its launch) for every generated kernel."""
    xnumel = {}
    for m in re.finditer(r"^def (\w+)\(", src, re.M):
        body = src[m.end():m.end() + 400]
        n = re.search(r"\n    xnumel = (\d+)\n", body)
        if n is not None:
            xnumel[m.group(1)] = int(n.group(1))
    out = []
    for var, name, consts in _LAUNCHER.findall(src):
        xb = eval(consts).get("XBLOCK")  # noqa: S307 - a dict literal the wrapper wrote
        call = re.search(rf"\b{var}\(\((\d+), ", src[src.index("\ndef call("):])
        if xb is None or call is None or name not in xnumel:
            continue
        out.append((name, xb, xnumel[name], int(call.group(1))))
    return out


@needs_triton
@pytest.mark.parametrize("templates", [False, True], ids=["kernels", "kernels+templates"])
def test_tuned_kernel_configs_launch_on_their_own_grid_and_match_eager(tmp_path, templates):
    n, d, tokens = 2, 32, 24
    dtype = torch.bfloat16
    fn, args = block(n), block_args(n, d, tokens, dtype)
    timer = SmallBlocksWin()
    at = AutotuneOptions(timer=timer, cache_root=str(tmp_path / "cache"), progress=False, kernel_configs=4,
                         matmul_configs=1, matmul_templates=templates)
    cg = compile_graph(trace(fn, *args), args, options=InductorOptions(cpu_backend="triton", max_autotune=True,
                                                                       autotune=at))
    src = cg.texts["output_code"]
    grids = launch_grids(src)
    assert grids, "no generated kernel launches found in the wrapper"
    # the timer made smaller blocks win: some kernel runs a tuned XBLOCK below its heuristic one
    assert any(lbl.startswith("RBLOCK") or lbl.startswith("XBLOCK") for lbl in timer.timed)
    for name, xb, xnumel, gx in grids:
        assert gx == -(-xnumel // xb), f"{name}: launched on {gx} programs of XBLOCK={xb} for xnumel={xnumel}"
    if templates:
        assert "_launch_tmpl_" in src
    torch.testing.assert_close(cg.fn(*args)[0], fn(*args)[0], rtol=5e-2, atol=5e-2)
