"""Triton kernels compiled ahead in worker processes (kiln/inductor/compile_pool.py, codegen/triton/ahead.py).

Without a GPU the workers cross-compile for cuda:90 (what ``KILN_TRITON_CROSS_TARGET`` does): the
binaries are real, only nothing launches them. A kernel compiled in a worker must land in triton's
cache under the key an in-process compile (the parent's first launch) computes, or the launch would
compile it again; that is what these tests compare. The graph itself still runs under the
interpreter here (this folder's conftest), after its first call waited for the workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor import compile_pool as cp
from kiln.inductor.codegen.triton import ahead
from kiln.inductor.codegen.triton.kernel import TritonKernel
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.compile_pool import CompileBatch, CompilePool, TritonJob
from kiln.inductor.ir import Layout

TARGET = ("cuda", 90, 32)
ADD = """
import triton
import triton.language as tl


@triton.jit
def add(X, Y, Z, XBLOCK: tl.constexpr):
    o = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(Z + o, tl.load(X + o) + tl.load(Y + o))
"""


def _module_file(tmp_path, text: str, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return str(path)


def _jobs(path: str, name: str, xblocks=(128, 256)) -> list[TritonJob]:
    return [TritonJob(path, name, "add", ("float32",) * 3, (("XBLOCK", xb),), 4, 1) for xb in xblocks]


def _kernel_dirs(cache: str) -> set[str]:
    """Cache folders holding a compiled kernel (a cubin), by key."""
    if not os.path.isdir(cache):
        return set()
    return {d for d in os.listdir(cache) if any(f.endswith(".cubin") for f in os.listdir(os.path.join(cache, d)))}


def _compile_in_a_plain_process(jobs: list[TritonJob], cache: str) -> None:
    """What the parent's own compile (its first launch) does, in a process without the interpreter."""
    script = textwrap.dedent(f"""
        from kiln.inductor.compile_worker import compile_job
        for job in {[j.as_dict(None) for j in jobs]!r}:
            status, _, error, _ = compile_job(job, {TARGET!r})
            assert status == "ok", error
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(env, TRITON_CACHE_DIR=cache), timeout=300)


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A one-worker pool compiling into ``tmp_path/cache``, installed as the process's pool."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    p = CompilePool(1)
    assert p.start()
    with cp.PROCESS_POOL.using(p):
        yield p
    p.close()


def test_a_worker_finds_what_an_in_process_compile_made_and_compiles_nothing(tmp_path, monkeypatch):
    """The parent's own compile (a plain process: its first launch) fills the cache; a worker asked
    for the same kernel then writes nothing new: both compute the same key, so a launch after a
    worker's compile finds that binary, and a second process compiles nothing."""
    path = _module_file(tmp_path, ADD, "kiln_test_pool_add")
    jobs = _jobs(path, "kiln_test_pool_add", (128,))
    _compile_in_a_plain_process(jobs, str(tmp_path / "cache"))
    made = _kernel_dirs(str(tmp_path / "cache"))
    assert len(made) == 1
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    p = CompilePool(1)
    assert p.start()
    try:
        report = cp.TritonCompilePool(started=p).submit(jobs, TARGET, "add").wait()  # type: ignore[union-attr]
    finally:
        p.close()
    assert (report.jobs, report.compiled, report.failed, report.in_process) == (1, 1, 0, 0), report.errors
    assert _kernel_dirs(str(tmp_path / "cache")) == made


def _layers(x, *ws):  # identical layers: twins sharing one function
    for w in ws:
        x = x + F.gelu(F.layer_norm(x, x.shape[-1:]) @ w)
    return (x,)


def test_graph_kernels_compile_in_the_pool_and_the_first_call_waits_and_matches_eager(pool, monkeypatch, caplog):
    monkeypatch.setattr(ahead, "compile_target", lambda device: (TARGET, True))
    dev = device()
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(8, 32, generator=g).to(dev)] + [torch.randn(32, 32, generator=g).to(dev) * 0.2
                                                          for _ in range(3)]
    before = os.environ.get("KILN_TRITON_PRECOMPILE")
    cg = compile_graph(trace(_layers, *args), args, options=InductorOptions(cpu_backend="triton"))
    assert os.environ.get("KILN_TRITON_PRECOMPILE") == before  # never touched: a module global tells the wrapper its kernels are compiled ahead
    batch = cg.fn.pending
    assert isinstance(batch, CompileBatch) and batch.jobs
    assert len({(j.function, j.constants, j.num_warps) for j in batch.jobs}) == len(batch.jobs)  # distinct only
    torch.testing.assert_close(cg.fn(*args)[0], _layers(*args)[0], rtol=1e-4, atol=1e-5)
    assert cg.fn.pending is None  # waited on the first call
    report = cg.wait_kernels()
    assert report.compiled == report.jobs == len(batch.jobs) and report.in_process == 0, report.errors
    assert len(_kernel_dirs(os.environ["TRITON_CACHE_DIR"])) == report.jobs  # each compiled in the worker


def _twin(k: TritonKernel, **changes) -> TritonKernel:
    return dataclasses.replace(k, name=k.name + "_twin", function=k.name, **changes)


def test_twins_with_their_own_tuned_config_are_their_own_jobs():
    src = "@triton.jit\ndef k1(ptr_a, ptr_b, XBLOCK: tl.constexpr):\n    pass\n"
    k = TritonKernel(name="k1", source=src, pointer_args=("a", "b"), size_args=(), xnumel="64", xblock=64,
                     rblock=0, num_warps=4, kind="pointwise")
    layouts = {b: Layout.contiguous((64,), torch.bfloat16, "cuda") for b in ("a", "b", "c", "d")}
    same = _twin(k, pointer_args=("c", "d"))
    tuned = _twin(k, pointer_args=("c", "d"), xblock=128, num_warps=8)  # max-autotune chose another config
    symbolic = dataclasses.replace(k, name="k2", size_args=("s0",))
    jobs = ahead.kernel_jobs([k, same, tuned, symbolic], layouts, "/x.py", "m")
    assert [(j.function, dict(j.constants)["XBLOCK"], j.num_warps, j.sizes) for j in jobs] == [
        ("k1", 64, 4, 0), ("k1", 128, 8, 0), ("k2", 64, 4, 1)]  # symbolic sizes compile ahead too
    assert jobs[0].dtypes == ("bfloat16", "bfloat16")
    # one C launcher per signature (triton <= 3.6 builds one with the host compiler): the first job's;
    # a size argument is part of the signature
    assert [j.builds_launcher for j in jobs] == [True, False, True]
    assert jobs[0].as_dict(TARGET, launcher=True)["launcher"] and not jobs[1].as_dict(TARGET, True)["launcher"]


def test_no_workers_means_in_process_with_a_log(caplog):
    pool = cp.TritonCompilePool(workers=0)  # as KILN_TRITON_COMPILE_WORKERS=0 makes the process's pool
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        assert pool.get() is None
        assert pool.submit(_jobs("/nowhere.py", "m"), TARGET, "g") is None
    assert any("KILN_TRITON_COMPILE_WORKERS=0" in r.getMessage() for r in caplog.records)


def test_gpu_graph_queued_while_workers_start_gets_help_from_this_process(monkeypatch, caplog):
    """On a GPU host a graph submitted before any worker is ready is queued as usual, and this process
    starts compiling from the queue itself (``help_while_starting``) instead of waiting idle; once a
    worker is ready, nobody is asked to help."""
    class Pool:
        gpu, ready, queued, helped, alive, pid = True, 0, 0, 0, 1, os.getpid()

        def submit(self, batch):
            self.queued += len(batch.jobs)
            return True

        def help_while_starting(self):
            self.helped += 1

    pool = Pool()
    holder = cp.TritonCompilePool(started=pool)  # type: ignore[arg-type]
    jobs = _jobs("/nowhere.py", "m")
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        assert holder.submit(jobs, TARGET, "the first graph") is not None
    assert (pool.queued, pool.helped) == (len(jobs), 1)
    assert any("still starting; this process compiles the first graph's kernels" in r.getMessage()
               for r in caplog.records)
    pool.ready = 1
    assert holder.submit(jobs, TARGET, "a later graph") is not None
    assert (pool.queued, pool.helped) == (2 * len(jobs), 1)


def test_helpers_compile_the_queue_while_no_worker_is_ready(tmp_path):
    """The helper threads really compile what is queued (cross-compiled for cuda:90 here) and answer
    the batch; the cubins land in triton's cache where the first launch looks."""
    path = _module_file(tmp_path, ADD, "kiln_triton_help")
    out = _run_clean(tmp_path, f"""
        import time
        pool = CompilePool(1)  # never started: no worker will ever be ready
        pool.alive = 1
        jobs = [TritonJob({path!r}, "kiln_triton_help", "add", ("float32",) * 3, (("XBLOCK", xb),), 4, 1)
                for xb in (64, 128, 256)]
        batch = cp.CompileBatch(jobs, {TARGET!r}, "g")
        assert pool.submit(batch)
        pool.help_while_starting()
        assert batch.done.wait(240), "helpers did not finish"
        rep = batch.wait()
        print("REPORT", rep.compiled, rep.failed, pool.helpers)
    """)
    assert "REPORT 3 0" in out, out
    assert len(_kernel_dirs(str(tmp_path / "cache"))) == 3


def _run_clean(tmp_path, body: str) -> str:
    """Run ``body`` in a fresh process without the interpreter (this process imported triton under
    it, which leaves triton unable to compile here); returns its log output."""
    script = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
        from kiln.inductor import compile_pool as cp
        from kiln.inductor.compile_pool import CompilePool, TritonJob
    """) + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), KILN_LOGS="perf_hints")
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr  # kiln's logs go to stderr


DIES_IN_WORKER = """
import os
import sys

if sys.argv[0].endswith("compile_worker.py"):
    os._exit(3)  # a worker crashing on this kernel (the parent imports it fine)
""" + ADD


def test_lost_workers_fall_back_to_this_process_with_a_log(tmp_path):
    """A worker dying on a job hands it back (compiled here); with no worker left, and when workers
    cannot start at all, kernels compile in this process; each case says so in perf_hints."""
    dies = _module_file(tmp_path, DIES_IN_WORKER, "kiln_test_pool_dies")
    add = _module_file(tmp_path, ADD + "# fallback\n", "kiln_test_pool_fallback")
    out = _run_clean(tmp_path, f"""
        pool = CompilePool(1)
        holder = cp.TritonCompilePool(started=pool)
        assert pool.start()
        jobs = [TritonJob({dies!r}, "kiln_test_pool_dies", "add", ("float32",) * 3, (("XBLOCK", 32),), 4, 1)]
        batch = holder.submit(jobs, {TARGET!r}, "dying")
        assert batch is not None
        report = batch.wait()
        assert report.in_process == 1 and report.compiled == 1, report.errors
        assert holder.submit(jobs, {TARGET!r}, "after") is None  # no worker left: the caller compiles here

        cp.WORKER_SCRIPT = {str(tmp_path / "missing_worker.py")!r}  # every worker exits at once
        holder = cp.TritonCompilePool(workers=1)
        pool = holder.get()
        assert pool is not None  # the process started; it dies before saying it is ready
        for t in pool.threads:
            t.join(timeout=60)
        jobs = [TritonJob({add!r}, "kiln_test_pool_fallback", "add", ("float32",) * 3, (("XBLOCK", 64),), 4, 1)]
        assert holder.submit(jobs, {TARGET!r}, "g") is None
        report = cp.in_process(jobs, {TARGET!r}, "g").wait()
        assert report.in_process == 1 and report.compiled == 1, report.errors
    """)
    assert "died or timed out" in out and "did not start" in out and "compile in this process" in out, out
    assert len(_kernel_dirs(str(tmp_path / "cache"))) == 2


@pytest.mark.gpu
def test_gpu_first_launches_compile_nothing(tmp_path, monkeypatch):
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA device without the interpreter")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    p = CompilePool(2, gpu=True)
    assert p.start()
    with cp.PROCESS_POOL.using(p):  # compile_graph's kernels go to the process's pool
        deadline = time.monotonic() + 120  # a graph compiled before a worker is ready compiles in-process
        while p.ready == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        g = torch.Generator().manual_seed(1)
        args = [torch.randn(64, 96, generator=g).cuda()] + [torch.randn(96, 96, generator=g).cuda() * 0.1
                                                             for _ in range(3)]
        try:
            cg = compile_graph(trace(_layers, *args), args)
            report = cg.wait_kernels()
            before = _kernel_dirs(str(tmp_path / "cache"))
            out = cg.fn(*args)[0]
            torch.cuda.synchronize()
        finally:
            p.close()
    assert report.jobs > 0 and report.compiled == report.jobs, report.errors
    assert _kernel_dirs(str(tmp_path / "cache")) == before  # the launches loaded what the workers built
    torch.testing.assert_close(out, _layers(*args)[0], rtol=1e-3, atol=1e-3)


def test_a_worker_compiles_without_importing_torch_into_the_key_torch_dtypes_give(tmp_path):
    """Workers start with triton only (importing torch was 2-4 s of each worker's start): a kernel
    compiled there, from mock tensors over stand-in dtypes, lands under the cache key that real torch
    dtypes (the parent's launch) give, and torch is never imported."""
    path = _module_file(tmp_path, ADD, "kiln_test_pool_notorch")
    jobs = _jobs(path, "kiln_test_pool_notorch", (128,))
    _compile_in_a_plain_process(jobs, str(tmp_path / "with_torch"))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(cp.WORKER_SCRIPT)!r})
        import compile_worker
        for job in {[j.as_dict(None) for j in jobs]!r}:
            status, _, error, _ = compile_worker.compile_job(job, {TARGET!r})
            assert status == "ok", error
        assert "torch" not in sys.modules, "a worker imported torch"
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   env=dict(env, TRITON_CACHE_DIR=str(tmp_path / "without_torch")))
    made = _kernel_dirs(str(tmp_path / "with_torch"))
    assert len(made) == 1 and _kernel_dirs(str(tmp_path / "without_torch")) == made


def test_autotune_candidates_compile_on_the_same_pool(pool, tmp_path):
    """max-autotune has no compile workers of its own: its candidates are jobs of the one pool that
    compiles a graph's kernels (autotune/compilers.py PoolCompiler), into triton's cache; candidates
    whose turn comes after the tuning deadline are skipped, not compiled."""
    from kiln.inductor.autotune.compilers import CompileJob, PoolCompiler, TargetCompiler
    from kiln.runtime import load_triton_module

    add = load_triton_module(ADD + "# autotune on the pool\n").add
    jobs = [CompileJob(add, (torch.float32,) * 3, (("XBLOCK", xb),), 4, 1, f"add {xb}") for xb in (64, 128)]
    served: list[CompileBatch] = []
    submit = pool.submit
    pool.submit = lambda batch: served.append(batch) or submit(batch)  # type: ignore[method-assign]
    compiler = PoolCompiler(TARGET, fallback=TargetCompiler("cuda:90"), pool=cp.TritonCompilePool(started=pool))
    stats = compiler(jobs, deadline=time.perf_counter() + 300)
    assert (stats.jobs, stats.compiled, stats.failed, stats.skipped, stats.mode) == (2, 2, 0, 0, "process"), stats.errors
    assert len(served) == 1 and [j.function for j in served[0].jobs] == ["add", "add"]
    assert len(_kernel_dirs(os.environ["TRITON_CACHE_DIR"])) == 2  # compiled by the pool's worker
    late = compiler([CompileJob(add, (torch.float32,) * 3, (("XBLOCK", 256),), 4, 1, "add 256")],
                    deadline=time.perf_counter() - 1)
    assert (late.jobs, late.compiled, late.skipped) == (1, 0, 1)
    assert len(_kernel_dirs(os.environ["TRITON_CACHE_DIR"])) == 2  # nothing compiled after the deadline


def test_a_thread_compiling_for_a_target_leaves_other_threads_the_real_driver():
    """A tiered wrapper builds its C++ program (cubins compiled in this process for the device's target)
    on a background thread while the model keeps launching kernels on the main thread: the launches must
    still reach the driver that can launch (they got the target-only driver once: 'launcher_cls')."""
    import threading

    from triton.runtime import driver

    from kiln.inductor.compile_worker import target_driver

    class Launching:  # stands in for triton's CUDA driver
        launcher_cls = "the real launcher"

        def get_current_target(self):
            return "the device's target"

    before = driver._active
    real = Launching()
    driver.set_active(real)
    inside, leave, seen = threading.Event(), threading.Event(), {}

    def compiling():
        with target_driver(TARGET):
            seen["target"] = driver.active.get_current_target()
            with pytest.raises(AttributeError, match="launcher_cls"):
                driver.active.launcher_cls  # noqa: B018
            inside.set()
            leave.wait(10)

    try:
        t = threading.Thread(target=compiling)
        t.start()
        assert inside.wait(10)
        assert driver.active.launcher_cls == "the real launcher"
        assert driver.active.get_current_target() == "the device's target"
        with target_driver(("cuda", 80, 32)):  # a second compiling thread has its own target
            assert driver.active.get_current_target().arch == 80
        assert driver.active.launcher_cls == "the real launcher"
        leave.set()
        t.join(10)
        assert seen["target"].arch == 90
        assert driver.active is real  # the last compiling thread out put the real driver back
    finally:
        leave.set()
        driver._active = before


def test_workers_started_for_a_target_compile_the_warm_up_kernel_before_any_job(tmp_path, monkeypatch):
    """A pool started for a target (warm_compile_pool: the first CUDA graph's compile) has each worker
    compile compile_warmup.py's kernel right after its imports -- triton's first-compile costs (its cache
    key's hash of its library, its code generator's imports, ptxas's first run) paid while the parent
    captures and lowers, not on the first job -- and the jobs still compile into the cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    p = CompilePool(1)
    assert p.start(TARGET)
    try:
        deadline = time.monotonic() + 120
        while not _kernel_dirs(str(cache)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_kernel_dirs(str(cache))) == 1  # the warm-up kernel, with no job submitted
        path = _module_file(tmp_path, ADD, "kiln_test_pool_warm")
        batch = CompileBatch(_jobs(path, "kiln_test_pool_warm", (128,)), TARGET, "warm")
        assert p.submit(batch)
        report = batch.wait()
        assert report.compiled == 1 and report.in_process == 0
        assert len(_kernel_dirs(str(cache))) == 2
    finally:
        p.close()
