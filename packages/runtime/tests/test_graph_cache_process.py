"""Warm start across processes: a second process compiling the same model (inference and training)
loads the compiled graphs from the graph cache — no recompilation — and matches eager."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("kiln.inductor")  # needs the full compiler (this test runs the meta-package)
pytest.importorskip("kiln.capture")

CHILD = textwrap.dedent('''
    import sys, torch
    import kiln
    import kiln.autograd, kiln.inductor
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    compiled = kiln.compile(model, backend=sys.argv[1])
    # training: forward + backward through the cached training program
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    # inference
    model.eval(); ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
    print("OK")
''')


@pytest.mark.slow  # two processes each compiling with g++ (~1 min on 2 loaded cores)
@pytest.mark.parametrize("backend", ["inductor"])
def test_second_process_hits_and_matches_eager(tmp_path: Path, backend: str) -> None:
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_LOGS="cache")
    env.pop("KILN_GRAPH_CACHE", None)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    logs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), backend], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "OK" in proc.stdout
        logs.append(proc.stderr)
    cold, warm = logs
    assert cold.count("graph cache miss") == 2 and "graph cache hit" not in cold, cold
    assert warm.count("graph cache hit") == 2 and "graph cache miss" not in warm, warm
