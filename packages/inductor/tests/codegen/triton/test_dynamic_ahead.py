"""Triton kernels with symbolic sizes compile ahead, once, for every size (codegen/triton/kernel.py
SIZE_ARG_TYPE, ahead.py, launcher.py).

Their size arguments are declared ``i64`` and ``do_not_specialize``, so triton keys the binary by
that type alone: the compile pool compiles each such kernel before any size is known (cross-compiled
for cuda:90 here, as ``KILN_TRITON_CROSS_TARGET`` does), and a launch with any size -- 0, 1, odd,
multiples of 16 and not, above 2**31 -- computes the key of that one binary. What a launch computes is
asked of triton itself, in a process without the interpreter; the graph's results over many sizes are
checked under the interpreter (this folder's conftest), where the same kernel source runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import (
    TRITON,
    check_sizes,
    compile_symbolic,
    is_dynamic,
    needs_triton,
    symbolic_graph,
)

from kiln.inductor import compile_graph
from kiln.inductor import compile_pool as cp
from kiln.inductor.codegen.triton import ahead, backend
from kiln.inductor.codegen.triton.kernel import SIZE_ARG_TYPE, TritonKernel
from kiln.inductor.compile_pool import CompileBatch, CompilePool

TARGET = ("cuda", 90, 32)
SIZES = (0, 1, 7, 16, 33, 512)


def _block(x, w, b):
    """Rows and sequence symbolic (as a serving stream's batch and length): norm, softmax over the
    sequence, a reduction, pointwise."""
    h = F.layer_norm(x, x.shape[-1:], w, b)
    scores = torch.softmax(h.sum(-1), -1)
    return (F.gelu(h) * scores[..., None] + x, h.mean(1))


def _block_args(n: int, rows: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n)
    return (torch.randn(rows, n, 24, generator=g), torch.randn(24, generator=g), torch.randn(24, generator=g))


def _kernel_dirs(cache: str) -> set[str]:
    if not os.path.isdir(cache):
        return set()
    return {d for d in os.listdir(cache) if any(f.endswith(".cubin") for f in os.listdir(os.path.join(cache, d)))}


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A one-worker pool cross-compiling for cuda:90 into ``tmp_path/cache``, the process's pool."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ahead, "compile_target", lambda device: (TARGET, True))
    p = CompilePool(1)
    assert p.start()
    with cp.PROCESS_POOL.using(p):
        yield p
    p.close()


def _compile_recording_kernels(monkeypatch) -> tuple[object, list[TritonKernel]]:
    """The symbolic graph of ``_block`` compiled for the Triton path, and the kernels handed to the pool."""
    handed: list[TritonKernel] = []
    real = backend.compile_ahead

    def recording(kernels, *args, **kwargs):
        handed.extend(kernels)
        return real(kernels, *args, **kwargs)

    monkeypatch.setattr(backend, "compile_ahead", recording)
    gm, examples = symbolic_graph(_block, *_block_args(37, rows=3), dynamic={0: (0, 1)})
    cg = compile_graph(gm, examples, options=TRITON)
    assert cg.backend == "inductor" and is_dynamic(cg), cg.texts.get("fallbacks")
    return cg, handed


@needs_triton  # CPU tensors on the Triton path: the interpreter (the GPU test below: the device)
def test_symbolic_size_kernels_compile_ahead_in_the_pool(pool, monkeypatch):
    cg, kernels = _compile_recording_kernels(monkeypatch)
    dynamic = [k for k in kernels if k.size_args]
    assert dynamic and len(dynamic) == len(kernels), [k.name for k in kernels]  # every kernel here has sizes
    for k in dynamic:  # every size argument declared unspecialised, with its type
        assert k.source.startswith(f"@triton.jit(do_not_specialize={list(k.size_args)!r})"), k.source[:200]
        assert all(f'{s}: "{SIZE_ARG_TYPE}"' in k.source.splitlines()[1] for s in k.size_args), k.source[:200]
    batch = cg.fn.pending
    assert isinstance(batch, CompileBatch)
    by_function = {j.function: j for j in batch.jobs}
    for k in dynamic:  # each handed to the pool with its size arguments
        assert by_function[k.function or k.name].sizes == len(k.size_args)
    report = cg.wait_kernels()
    assert report.jobs == len(batch.jobs) == report.compiled and report.in_process == 0, report.errors
    assert len(_kernel_dirs(os.environ["TRITON_CACHE_DIR"])) == report.jobs  # each compiled in the worker

    # what a launch with each size computes, asked of triton (no interpreter): the worker's binary
    jobs = [j.as_dict(TARGET) for j in batch.jobs]
    before = _kernel_dirs(os.environ["TRITON_CACHE_DIR"])
    out = _run_clean(f"""
        import torch
        from kiln.inductor.codegen.triton.launcher import KilnLaunch
        from kiln.inductor.compile_worker import load_module, target_driver
        from kiln.runtime.triton_notes import LaunchRecord

        for job in json.loads({json.dumps(jobs)!r}):
            fn = getattr(load_module(job["path"], job["module"]), job["function"])
            nptr, nsize = len(job["dtypes"]), job["sizes"]
            free = tuple(range(nptr, nptr + nsize))
            assert all(fn.params[i].do_not_specialize and fn.params[i].annotation_type == "i64" for i in free)
            consts = dict(job["constants"])
            dtypes = [getattr(torch, d) for d in job["dtypes"]]  # as the worker compiled them
            tensors = [torch.empty(64, dtype=d) for d in dtypes]  # as a launch describes them
            hashes, keys, records = set(), set(), set()
            launch = KilnLaunch(fn, consts, job["num_warps"], (), job["num_stages"], free=free)
            assert launch.free == {{i: "i64" for i in free}} and launch.check == (), (launch.free, launch.check)
            with target_driver(tuple(job["target"])):
                for n in {list(SIZES) + [2**31 + 3]!r}:
                    kernel = fn.warmup(*dtypes, *[n] * nsize, grid=(1,), **consts, num_warps=job["num_warps"],
                                       num_stages=job["num_stages"])
                    hashes.add(kernel.hash)
                    records.add(LaunchRecord.of(launch.describe(tensors + [n] * nsize)))
            keys = set(fn.device_caches[0][0])
            assert len(hashes) == len(keys) == len(records) == 1, (job["function"], hashes, keys, records)
            print("SAME", job["function"], nsize)
    """)
    assert out.count("SAME") == len(jobs), out
    assert _kernel_dirs(os.environ["TRITON_CACHE_DIR"]) == before  # no size compiled anything new


def _run_clean(body: str) -> str:
    """``body`` in a fresh process without the interpreter (this one imported triton under it)."""
    script = "import json\n" + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_triton  # CPU tensors on the Triton path: the interpreter (the GPU test below: the device)
def test_one_symbolic_compile_matches_eager_over_sizes():
    """One compiled graph, every size: 0, 1, a prime, multiples of 16 and not, larger than a block."""
    cg = compile_symbolic(_block, *_block_args(37, rows=3), options=TRITON, dynamic={0: (0, 1)})
    assert is_dynamic(cg), cg.loop_program.as_text()
    check_sizes(cg, _block, _block_args, SIZES, atol=1e-4)
    check_sizes(cg, _block, lambda n: _block_args(5, rows=n), SIZES, atol=1e-4)  # the other symbolic dim


@needs_triton  # CPU tensors on the Triton path: the interpreter (the GPU test below: the device)
def test_reduction_over_a_symbolic_dim_matches_eager_over_sizes():
    """The reduced dimension symbolic: its loop bound is an unspecialised size argument."""
    cg = compile_symbolic(lambda x: (x.sum(0), torch.softmax(x, 0)), torch.randn(37, 6), options=TRITON,
                          dynamic={0: (0,)})
    assert is_dynamic(cg), cg.loop_program.as_text()
    check_sizes(cg, lambda x: (x.sum(0), torch.softmax(x, 0)), lambda n: (torch.randn(n, 6),), SIZES)


def test_wrapper_precompile_warms_symbolic_size_kernels_with_a_stand_in_size():
    """Without the pool (no workers, or a wrapper loaded where kiln.inductor's pool is not used) the
    wrapper's own precompile compiles symbolic-size kernels too: any value stands for the sizes."""
    from kiln.inductor.codegen.triton.wrapper import wrapper_prologue

    k = TritonKernel(name="k0", source='@triton.jit(do_not_specialize=["s0"])\ndef k0(ptr_a, s0: "i64", '
                     'XBLOCK: tl.constexpr):\n    pass\n', pointer_args=("a",), size_args=("s0",),
                     xnumel="s0", xblock=128, rblock=0, num_warps=4, kind="pointwise")
    text = wrapper_prologue([k], dtypes={"a": torch.bfloat16})
    line = next(x for x in text.splitlines() if x.startswith("_kiln_precompile("))
    assert "(_launch_k0, (torch.bfloat16, 0, ))" in line, line
    launcher = next(x for x in text.splitlines() if x.startswith("_launch_k0 = "))
    assert launcher.endswith(", free=(1,))"), launcher


@pytest.mark.gpu
def test_gpu_symbolic_graph_first_launches_compile_nothing_at_any_size(tmp_path, monkeypatch):
    """On the GPU: the pool compiles the symbolic graph's kernels ahead; then calls with many sizes
    compile nothing (every launch finds the pool's binary), each kernel has one binary, and the fast
    launcher stays bound across sizes; results match eager."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA device without the interpreter")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    p = CompilePool(2, gpu=True)
    assert p.start()
    with cp.PROCESS_POOL.using(p):  # compile_graph's kernels go to the process's pool
        deadline = time.monotonic() + 120
        while p.ready == 0 and time.monotonic() < deadline:
            time.sleep(0.05)

        def cuda_args(n: int, rows: int = 2) -> tuple[torch.Tensor, ...]:
            return tuple(a.cuda() for a in _block_args(n, rows))

        try:
            gm, examples = symbolic_graph(_block, *cuda_args(37, rows=3), dynamic={0: (0, 1)})
            cg = compile_graph(gm, examples)
            report = cg.wait_kernels()
            before = _kernel_dirs(str(tmp_path / "cache"))
            for n in (1, 7, 16, 33, 512):
                args = cuda_args(n)
                for got, want in zip(cg.fn(*args), _block(*args)):
                    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
            torch.cuda.synchronize()
        finally:
            p.close()
    assert report.jobs > 0 and report.compiled == report.jobs and report.in_process == 0, report.errors
    assert _kernel_dirs(str(tmp_path / "cache")) == before  # the launches loaded what the workers built
    launchers = [v for v in _wrapper_globals(cg.fn).values() if type(v).__name__ == "KilnLaunch" and v.free]
    assert launchers and all(launch.run is not None for launch in launchers)  # fast path bound, all sizes
    assert all(len(launch.fn.device_caches[0][0]) == 1 for launch in launchers)  # one binary per kernel


def _wrapper_globals(fn):
    while not hasattr(fn, "__globals__"):
        inner = getattr(fn, "call", None)
        fn = inner if inner is not None else next(c.cell_contents for c in fn.__closure__ if callable(c.cell_contents))
    return fn.__globals__
