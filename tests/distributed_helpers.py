"""Multi-process tests on CPU: N ranks spawned with torch.multiprocessing, the gloo backend on
127.0.0.1 (a free port), bounded in time.

A test calls ``run_ranks(rank_fn, *args)`` (the ``run_ranks`` fixture of conftest.py) where
``rank_fn(rank, world, *args)`` is a module-level function of the test file; each rank loads that
file by path (pytest imports test files in importlib mode, so they are not importable by name), joins
the process group and returns a picklable result. The fixture returns the results by rank; a rank's
exception is re-raised in the test with its traceback; a hang is killed after ``timeout`` seconds.
"""

from __future__ import annotations

import datetime
import importlib.util
import runpy
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

HERE = Path(__file__).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout: float = 240.0,
              backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks (``backend``: gloo, or nccl with rank
    r on cuda:r); the results by rank.

    A rank killed by a signal without a Python error (seen once on a loaded 2-core CI host: SIGABRT in
    gloo) is run again once, with a warning; a second such death, an error or a hang fails the test."""
    try:
        return _run_ranks_once(fn, *args, world=world, timeout=timeout, backend=backend)
    except _RankKilled as e:
        warnings.warn(f"distributed test {fn.__name__}: {e}; running the ranks again", stacklevel=2)
        return _run_ranks_once(fn, *args, world=world, timeout=timeout, backend=backend)


class _RankKilled(AssertionError):
    """A rank died by a signal and reported no Python error."""


def _run_ranks_once(fn: Callable[..., Any], *args: Any, world: int, timeout: float, backend: str) -> list[Any]:
    test_file = str(Path(fn.__code__.co_filename).resolve())
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kiln-dist-") as out:
        procs = []
        for rank in range(world):
            init = {"RANK_ARGS": (rank, world, port, test_file, fn.__name__, args, out, backend)}
            p = ctx.Process(target=runpy.run_path, args=(str(HERE),),
                            kwargs={"init_globals": init, "run_name": "__kiln_rank__"}, daemon=True)
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        errors = [(Path(out) / f"{r}.err").read_text() for r in range(world) if (Path(out) / f"{r}.err").exists()]
        if errors:
            raise AssertionError("a rank failed:\n" + "\n".join(errors))
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout:.0f} s")
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            codes = [procs[r].exitcode for r in bad]
            killed = all(c is not None and c < 0 for c in codes)
            raise (_RankKilled if killed else AssertionError)(f"ranks {bad} exited with codes {codes}")
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


def _rank_main(rank: int, world: int, port: int, test_file: str, fn_name: str, args: tuple, out: str,
               backend: str = "gloo") -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        spec = importlib.util.spec_from_file_location(f"kiln_rank_{Path(test_file).stem}", test_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        try:
            result = getattr(module, fn_name)(rank, world, *args)
        finally:
            dist.destroy_process_group()
        torch.save(result, Path(out) / f"{rank}.pt")
    except BaseException:
        (Path(out) / f"{rank}.err").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        raise


if __name__ == "__kiln_rank__":
    _rank_main(*globals()["RANK_ARGS"])
