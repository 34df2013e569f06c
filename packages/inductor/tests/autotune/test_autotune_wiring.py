"""max-autotune is called on the pipeline's generated Triton kernels (codegen/triton/backend.py).
On CPU the kernels run in the Triton interpreter and a FakeTimer decides, so the test checks the
wiring (every tunable kernel is benchmarked, the winner's configuration reaches the launch code)."""

from __future__ import annotations

import os

import pytest
import torch
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.autotune import (
    AutotuneCache,
    Autotuner,
    FakeTimer,
    kernel_configs,
)
from kiln.inductor.autotune.generated import autotune_kernels
from kiln.inductor.codegen.triton import generate_kernels

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="Triton kernels need a GPU or TRITON_INTERPRET=1")


def test_generated_kernels_are_tuned_and_the_winner_is_kept(tmp_path) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(16, 64, device=dev)  # small: the interpreter runs every configuration
    fn = lambda x: (torch.softmax(x, -1) * 2, (x.sin() + 1).relu())  # noqa: E731
    cg = compile_graph(trace(fn, x), [x], options=InductorOptions(cpu_backend="triton"))
    generated = [g for k in cg.scheduled.kernels() for g in generate_kernels(k)]
    softmax_k = next(k for k in generated if k.rblock)
    winner = kernel_configs(softmax_k, 16, 8)[-1]  # the last candidate: fastest
    timer = FakeTimer({winner.label: 0.1}, default=1.0)
    tuned = autotune_kernels(generated, cg.loop_program.layouts(), dev,
                             tuner=Autotuner(timer, AutotuneCache(tmp_path / "tune.json")))
    assert len(timer.timed) > len(generated)  # several configurations per kernel were benchmarked
    softmax = [k for k in tuned if k.rblock]
    assert softmax[0].xblock == winner.get("XBLOCK", 0) and softmax[0].num_warps == winner.num_warps
    assert f"'XBLOCK': {winner.get('XBLOCK', 0)}" in softmax[0].launcher_definition("m")
