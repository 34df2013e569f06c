"""kiln.capture's own guard and corpus tests (701 programs, each called three times with fresh inputs against
eager; guard, recompile and stale-value families) run again with the native guard checker installed, in a
child process: every answer the Python checks give there, the native checker gives too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPTURE_TESTS = ROOT / "packages" / "capture" / "tests"
FILES = ["test_corpus.py", "test_fresh_inputs.py", "test_dynamic_recompiles.py",
         "test_module_attributes.py", "test_module_call_guards.py", "test_pinned_layouts.py"]
CHILD = """
import sys
import kiln.runtime.native_guards as native_guards
from kiln.graph import guards_native
import pytest
assert native_guards.install() and guards_native.installed(), native_guards.reason()
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--basetemp", sys.argv[1], *sys.argv[2:]]))
"""


@pytest.mark.slow
def test_capture_suite_passes_with_the_native_checker(tmp_path):
    files = [str(CAPTURE_TESTS / f) for f in FILES if (CAPTURE_TESTS / f).exists()]
    assert len(files) == len(FILES), files
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "basetemp"), *files], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
