"""Run one measurement in a fresh Python process.

A crash, an OOM or a hang of one row (say, a segfault in generated code) must not stop the suite, and
compile caches must not leak between backends. So each row runs as
``python -m benchmarks.kiln_bench.child TASK.json`` with its own empty cache directories for
TorchInductor, Triton and kiln (unless the caller passes its own), under a timeout; the child writes
its result as JSON and the parent turns any failure into a row with the error text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KILN_CACHE_DIR")


def fresh_cache_env(root: Path) -> dict[str, str]:
    """Environment variables pointing every compiler cache into new folders under ``root``."""
    env = {}
    for var in CACHE_VARS:
        path = root / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
    return env


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout_s: float,
                 log_path: Path | None = None, env: dict[str, str] | None = None,
                 fresh_caches: bool = True) -> dict[str, Any]:
    """Call ``target`` ("module:function") with ``kwargs`` in a child process; return its dict.

    On a crash/timeout the result is ``{"error": "<what happened>"}`` with the tail of stderr.
    ``result["child_wall_s"]`` is the child's wall time including interpreter start-up.
    """
    with tempfile.TemporaryDirectory(prefix="kiln_bench_") as tmp:
        tmpdir = Path(tmp)
        task = tmpdir / "task.json"
        result_path = tmpdir / "result.json"
        task.write_text(json.dumps({"target": target, "kwargs": kwargs,
                                    "result": str(result_path)}))
        child_env = dict(os.environ)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), child_env.get("PYTHONPATH", "")) if p)
        if fresh_caches:
            child_env.update(fresh_cache_env(tmpdir / "caches"))
        if env:
            child_env.update(env)
        log = open(log_path, "w") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.kiln_bench.child", str(task)],
                cwd=REPO_ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
            wall = time.perf_counter() - t0
            if result_path.exists():
                result = json.loads(result_path.read_text())
            elif rc is None:
                result = {"error": f"timeout after {timeout_s:.0f}s (killed)"}
            else:
                result = {"error": _describe_exit(rc, _tail(log, log_path))}
        finally:
            log.close()
        result["child_wall_s"] = round(wall, 2)
        return result


def _kill_group(proc: subprocess.Popen) -> None:
    # The child is the leader of its own session: this ends it and the compile workers it started.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _describe_exit(rc: int, tail: str) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        what = f"crashed ({name})" + (" - likely out of memory" if name == "SIGKILL" else "")
    else:
        what = f"exited with status {rc}"
    return f"{what}: {tail}" if tail else what


def _tail(log: Any, log_path: Path | None, lines: int = 3) -> str:
    try:
        if log_path is not None:
            log.flush()
            text = Path(log_path).read_text(errors="replace")
        else:
            log.seek(0)
            text = log.read()
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-500:]
