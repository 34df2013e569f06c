"""Measure what runtime controls: load_compiled_function + first call vs eager's first call (each in
a fresh process), and a C++ kernel build cold vs from the compile cache.

    uv run python packages/runtime/bench/load_time.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import fx

from kiln.graph import TensorSpec
from kiln.runtime import (
    CallFrame,
    CompileCache,
    compile_cpp,
    program_from_graph_module,
    save_artifact,
)

SETUP = textwrap.dedent('''
    import time, torch, torch.nn.functional as F
    torch.manual_seed(0)
    class Block(torch.nn.Module):
        def __init__(self, d=256):
            super().__init__()
            self.ln = torch.nn.LayerNorm(d)
            self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.ln(x))))
    model, x = Block(), torch.randn(8, 64, 256)
''')
EAGER = SETUP + textwrap.dedent('''
    t = time.perf_counter(); model(x); print(time.perf_counter() - t)
''')
LOADED = SETUP + textwrap.dedent('''
    import sys
    t0 = time.perf_counter()
    from kiln.runtime import load_compiled_function
    t = time.perf_counter()
    fn = load_compiled_function(sys.argv[1]); fn(model, x)
    print(time.perf_counter() - t, t - t0)
''')


def block_graph(ln_w, ln_b, w1, b1, w2, b2, x):
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    return (x + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2),)


def save_block(path: Path) -> None:
    ns: dict = {}
    exec(SETUP, ns)
    model, x = ns["model"], ns["x"]
    sources = ["L['self'].ln.weight", "L['self'].ln.bias", "L['self'].fc1.weight", "L['self'].fc1.bias",
               "L['self'].fc2.weight", "L['self'].fc2.bias", "L['x']"]
    values = [model.ln.weight, model.ln.bias, model.fc1.weight, model.fc1.bias, model.fc2.weight,
              model.fc2.bias, x]
    gm = fx.symbolic_trace(block_graph)
    save_artifact(path, program_from_graph_module(gm), frame=CallFrame.of(model.forward, (x,)),
                  input_sources=sources, input_specs=[TensorSpec.from_tensor(v) for v in values],
                  backend="eager")


def run(code: str, *args: str, env: dict) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=True)
    return [float(v) for v in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    repeat = ap.parse_args().repeat
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.kiln"
        save_block(path)
        env = {**os.environ, "KILN_CACHE_DIR": str(Path(tmp) / "cache")}
        eager = [run(EAGER, env=env)[0] for _ in range(repeat)]
        loaded = [run(LOADED, str(path), env=env) for _ in range(repeat)]
        cache = CompileCache(Path(tmp) / "cc")
        src = "extern \"C\" void k(float* a, long n) { for (long i = 0; i < n; ++i) a[i] += 1; }\n"
        t = time.perf_counter()
        compile_cpp(src, cache=cache)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        compile_cpp(src, cache=cache)
        warm = time.perf_counter() - t
    result = {
        "eager_first_call_s": statistics.median(eager),
        "load_plus_first_call_s": statistics.median(v[0] for v in loaded),
        "import_kiln_runtime_s": statistics.median(v[1] for v in loaded),
        "cpp_build_cold_s": cold, "cpp_build_cached_s": warm,
        "torch": torch.__version__, "repeat": repeat,
    }
    result["load_ratio"] = result["load_plus_first_call_s"] / result["eager_first_call_s"]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
