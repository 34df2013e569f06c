"""The Triton matmul template and its epilogues, run by the Triton interpreter on CPU (a subprocess, so
TRITON_INTERPRET=1 is set before triton loads), and tuned_mm's choice with a fake timer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from kiln.inductor.autotune import BIAS_GELU, Config, mm_configs, template_source

SCRIPT = textwrap.dedent("""
    import torch
    from kiln.inductor.autotune import (EPILOGUES, Autotuner, Config, FakeTimer, TunedMatmul, tuned_mm)

    torch.manual_seed(0)
    a, b, bias = torch.randn(33, 40), torch.randn(40, 24), torch.randn(24)
    cfg = Config.make(num_warps=4, num_stages=1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    for ep in EPILOGUES.values():
        args = (bias,) if ep.params else ()
        want = ep.torch_fn(a @ b, *args)
        got = TunedMatmul(ep, cfg, a.dtype)(a, b, *args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        ext = TunedMatmul(ep, Config(extern="cublas"), a.dtype)(a, b, *args)
        torch.testing.assert_close(ext, want, rtol=1e-4, atol=1e-4)
        print("ok", ep.name)
    # non-contiguous operand (a transposed view)
    at = torch.randn(40, 33).t()
    torch.testing.assert_close(TunedMatmul(EPILOGUES["none"], cfg, a.dtype)(at, b), at @ b, rtol=1e-4, atol=1e-4)
    configs = [cfg, Config.make(num_warps=2, num_stages=1, BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=8)]
    # template faster -> template; extern faster -> extern
    t = tuned_mm(a, b, tuner=Autotuner(FakeTimer({"cublas": 1.0, cfg.label: 0.5})), epilogue=EPILOGUES["bias_relu"],
                 epilogue_args=(bias,), configs=configs, device_name="cpu-test")
    assert t.uses_template and t.config == cfg, t.config
    torch.testing.assert_close(t(a, b, bias), torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
    t = tuned_mm(a, b, tuner=Autotuner(FakeTimer({"cublas": 0.5, cfg.label: 0.6})), epilogue=EPILOGUES["bias"],
                 epilogue_args=(bias,), configs=configs, device_name="cpu-test")
    assert not t.uses_template
    from kiln.inductor.autotune import autotune_mm
    t = autotune_mm(33, 40, 24, torch.float32, "cpu", epilogue=EPILOGUES["relu"],
                    tuner=Autotuner(FakeTimer({"cublas": 0.1})))
    torch.testing.assert_close(t(a, b), torch.relu(a @ b), rtol=1e-4, atol=1e-4)
    print("ok tuned")
""")


def test_template_and_epilogues_under_interpreter(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "KILN_CACHE_DIR": str(tmp_path)}
    env.pop("KILN_INDUCTOR_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=170, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[-2] == "ok tuned"
    assert "ok bias_gelu" in out.stdout


def test_template_source_precision_and_epilogue():
    src = template_source(BIAS_GELU, torch.bfloat16)
    assert "BIAS, M, N, K" in src and "tl.math.erf" in src and "input_precision" not in src
    assert 'input_precision="ieee"' in template_source(BIAS_GELU, torch.float32) or \
        torch.backends.cuda.matmul.allow_tf32
    compile(src, "<template>", "exec")


def test_mm_configs_clip_to_problem():
    cfgs = mm_configs(1, 4096, 4096)  # decode-shaped: one row
    assert all(c.get("BLOCK_M") == 16 for c in cfgs)
    assert len(set(cfgs)) == len(cfgs)
    assert len(mm_configs(4096, 4096, 4096, limit=5)) == 5
    assert all(isinstance(c, Config) and c.num_stages >= 3 for c in mm_configs(4096, 4096, 4096)[:3])
