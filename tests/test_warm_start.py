"""Warm starts: a graph-cache hit skips the whole backend, including importing its stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
import kiln.backends as backends
from kiln.graph import BackendUnavailable
from kiln.runtime import CompileCache
from kiln.runtime.cache import using_cache


def test_a_graph_cache_hit_does_not_build_the_backend(tmp_path: Path) -> None:
    """The second kiln.compile (what a restarted process does) loads the graph: a hit, nothing compiled.
    That a hit imports no compiler stage is test_a_warm_process_imports_no_compiler_stage's subject."""
    net = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(4, 8)
    with using_cache(CompileCache(tmp_path)), torch.no_grad():
        expected = net(x)
        before = kiln.stats()
        first = kiln.compile(net, backend="aot_eager")
        assert (kiln.stats() - before).graphs_captured == 0  # kiln.compile itself captures nothing
        torch.testing.assert_close(first(x), expected)
        missed = kiln.stats() - before
        assert (missed.cache_misses, missed.cache_hits) == (1, 0)  # the miss compiled the graph
        second = kiln.compile(net, backend="aot_eager")
        torch.testing.assert_close(second(x), expected)
    hit = kiln.stats() - before
    assert (hit.cache_misses, hit.cache_hits) == (1, 1), "the graph was compiled again instead of loaded"


def test_options_are_still_checked_when_compiling() -> None:
    with pytest.raises(ValueError, match="no_such_option"):
        kiln.compile(nn.Linear(2, 2), backend="inductor", options={"no_such_option": 1})


def test_a_missing_stage_is_reported_at_compile_time(monkeypatch: pytest.MonkeyPatch) -> None:
    real = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name == "kiln.inductor" else real(name, *a))
    with pytest.raises(BackendUnavailable, match="kiln.inductor"):
        kiln.compile(nn.Linear(2, 2), backend="inductor")


_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import kiln
    torch.manual_seed(0)
    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    net, ref = make(), make()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(3, 8)
    out = kiln.compile(net)(x)  # training: forward and backward come from the cached program
    out.square().sum().backward()
    expected = ref(x)
    expected.square().sum().backward()
    ok = torch.allclose(out, expected, rtol=1e-4, atol=1e-5) and all(
        torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5)
        for a, b in zip(net.parameters(), ref.parameters()))
    print(json.dumps({"ok": ok, "stages": sorted(m for m in ("kiln.inductor", "kiln.autograd",
                                                             "kiln.decomp") if m in sys.modules)}))
""")


def test_a_warm_process_imports_no_compiler_stage(tmp_path: Path) -> None:
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):  # cold, then warm (same cache folder)
        proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                              text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["ok"] and warm["ok"]
    assert "kiln.inductor" in cold["stages"]
    assert warm["stages"] == [], f"a warm start imported {warm['stages']}"


def test_the_captured_graph_is_printed_only_for_debug_dumps(monkeypatch: pytest.MonkeyPatch) -> None:
    printed: list[object] = []
    real = backends.print_graph
    monkeypatch.setattr(backends, "print_graph", lambda gm: printed.append(gm) or real(gm))
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh())
    x = torch.randn(2, 5)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(net, backend="aot_eager")(x), net(x))
    assert not backends.keeping_texts() and printed == []  # no KILN_DEBUG_DIR, no compile report


_LOADER = textwrap.dedent("""
    import json, sys, torch
    import kiln
    fn = kiln.load_compiled_function(sys.argv[1])
    x = torch.randn(3, 4)
    ok = torch.allclose(fn(x), torch.relu(x) * 2)
    print(json.dumps({"ok": ok, "stages": sorted(m for m in ("kiln.api", "kiln.capture", "sympy")
                                                 if m in sys.modules)}))
""")


def test_kiln_load_compiled_function_imports_only_the_runtime(tmp_path: Path) -> None:
    """``kiln.load_compiled_function`` is kiln.runtime's loader: a deployment process that loads a
    saved function does not import capture (nor kiln.api), and a static one not sympy."""
    def f(x):
        return torch.relu(x) * 2

    compiled = kiln.compile(f, fullgraph=True, backend="aot_eager").aot_compile(((torch.randn(3, 4),), {}))
    compiled.save_compiled_function(str(tmp_path / "f.kiln"))
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", _LOADER, str(tmp_path / "f.kiln")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["stages"] == [], out
