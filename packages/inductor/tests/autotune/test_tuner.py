"""Autotuner selection with a fake timer, the on-disk cache, and candidate configurations (CPU)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from kiln.inductor.autotune import (
    AutotuneCache,
    Autotuner,
    Candidate,
    Config,
    FakeTimer,
    NoViableCandidate,
    apply_config,
    kernel_configs,
    mode_flags,
    tune_kernel,
    tune_key,
)
from kiln.inductor.codegen.triton import TritonKernel


def cands(*labels_default):
    out = []
    for i, xb in enumerate((64, 128, 256, 512)):
        out.append(Candidate(Config.make(num_warps=4, XBLOCK=xb), lambda: None, is_default=(i == 0)))
    return out


def label(xb, w=4, s=1):
    return Config.make(num_warps=w, num_stages=s, XBLOCK=xb).label


def test_fastest_wins():
    timer = FakeTimer({label(64): 2.0, label(128): 1.0, label(256): 0.5, label(512): 0.9})
    choice = Autotuner(timer).select("k", "key", cands())
    assert choice.config.get("XBLOCK") == 256 and choice.ms == 0.5 and not choice.cached
    assert len(timer.timed) == 4 and choice.timings[label(512)] == 0.9


def test_default_kept_unless_clearly_faster():
    timer = FakeTimer({label(64): 1.0, label(128): 0.99, label(256): 1.5, label(512): 1.2})
    choice = Autotuner(timer, margin=0.02).select("k", "key", cands())
    assert choice.config.get("XBLOCK") == 64  # 1% faster is noise: keep the default
    timer = FakeTimer({label(64): 1.0, label(128): 0.9, label(256): 1.5, label(512): 1.2})
    assert Autotuner(timer, margin=0.02).select("k", "key", cands()).config.get("XBLOCK") == 128


def test_failing_candidates_are_skipped():
    def boom():
        raise RuntimeError("out of resources: shared memory")

    cs = cands()
    cs[2] = Candidate(cs[2].config, boom)
    timer = FakeTimer({label(64): 2.0, label(128): 1.0, label(256): 0.1, label(512): 0.9})
    choice = Autotuner(timer).select("k", "key", cs)
    assert choice.config.get("XBLOCK") == 512  # 256 would be fastest but cannot run
    assert "out of resources" in choice.failures[label(256)] and math.isinf(choice.timings[label(256)])


def test_all_failing_raises():
    def boom():
        raise RuntimeError("nope")

    cs = [Candidate(c.config, boom) for c in cands()]
    with pytest.raises(NoViableCandidate, match="every configuration failed"):
        Autotuner(FakeTimer({})).select("k", "key", cs)


def test_cache_round_trip_and_second_tuner_does_not_retune(tmp_path):
    path = tmp_path / "at.json"
    timer = FakeTimer({label(64): 2.0, label(128): 1.0, label(256): 0.5, label(512): 0.9})
    first = Autotuner(timer, AutotuneCache(path)).select("k", "key1", cands())
    assert AutotuneCache(path).get("key1") == (Config.make(num_warps=4, XBLOCK=256), 0.5)
    timer2 = FakeTimer({})
    again = Autotuner(timer2, AutotuneCache(path)).select("k", "key1", cands())
    assert again.cached and again.config == first.config and again.ms == 0.5 and timer2.timed == []
    # a cached config that is no longer among the candidates is re-tuned
    other = [Candidate(Config.make(num_warps=8, XBLOCK=32), lambda: None, is_default=True)]
    assert not Autotuner(FakeTimer({}), AutotuneCache(path)).select("k", "key1", other).cached


def test_cache_merges_concurrent_writers(tmp_path):
    path = tmp_path / "at.json"
    a, b = AutotuneCache(path), AutotuneCache(path)
    assert "ka" not in a and "kb" not in b
    a.put("ka", Config.make(XBLOCK=8), 1.0)
    b.put("kb", Config.make(XBLOCK=16), 2.0)
    c = AutotuneCache(path)
    assert c.get("ka")[0].get("XBLOCK") == 8 and c.get("kb")[0].get("XBLOCK") == 16


def test_cache_survives_garbage(tmp_path):
    """Entries live in kiln.runtime's compile cache: a corrupt file or a foreign schema is a miss."""
    from kiln.runtime import CompileCache

    store = CompileCache(tmp_path / "cc")
    cache = AutotuneCache(store)
    assert cache.get("x") is None
    cache.put("x", Config.make(XBLOCK=4), 1.0)
    assert AutotuneCache(store).get("x")[1] == 1.0
    for f in (tmp_path / "cc").rglob("*"):
        if f.is_file() and "autotune" in f.parts:
            f.write_bytes(b"garbage")
    assert AutotuneCache(store).get("x") is None
    store.put_json("autotune", AutotuneCache._stored_key("y"), {"schema": 999, "config": {}})
    assert AutotuneCache(store).get("y") is None


def test_cache_key_covers_versions(tmp_path):
    """The stored key adds the library versions (kiln.runtime.cache_key) to tune_key."""
    assert AutotuneCache._stored_key("k") != "k" and len(AutotuneCache._stored_key("k")) == 64


def test_cache_in_a_second_process(tmp_path):
    path = tmp_path / "at.json"
    timer = FakeTimer({label(64): 2.0, label(128): 1.0, label(256): 0.5, label(512): 0.9})
    Autotuner(timer, AutotuneCache(path)).select("k", "key1", cands())
    code = f"""
from kiln.inductor.autotune import AutotuneCache, Autotuner, Candidate, Config
class NoTimer:
    def __call__(self, launch, label):
        raise SystemExit("re-tuned in the second process")
cs = [Candidate(Config.make(num_warps=4, XBLOCK=x), lambda: None, is_default=(x == 64)) for x in (64, 128, 256, 512)]
c = Autotuner(NoTimer(), AutotuneCache({str(path)!r})).select("k", "key1", cs)
print(c.cached, c.config.get("XBLOCK"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "256"]


def test_tune_key_separates_devices_sizes_dtypes():
    k = tune_key("src", "H100", (1024,), ("torch.float32",))
    assert k == tune_key("src", "H100", (1024,), ("torch.float32",))
    assert len({k, tune_key("src", "H200", (1024,), ("torch.float32",)), tune_key("src", "H100", (2048,)),
                tune_key("src2", "H100", (1024,), ("torch.float32",)),
                tune_key("src", "H100", (1024,), ("torch.bfloat16",))}) == 5




def test_kernel_configs_pointwise():
    k = TritonKernel("add", "src", ("a", "b"), (), "4096", 1024, 0, 4, "pointwise")
    cfgs = kernel_configs(k, 4096)
    assert cfgs[0] == Config.make(num_warps=4, XBLOCK=1024)
    assert len(cfgs) > 8 and len(set(cfgs)) == len(cfgs)
    assert all(c.get("XBLOCK") <= 4096 for c in cfgs)
    small = kernel_configs(TritonKernel("add", "src", ("a",), (), "100", 128, 0, 1, "pointwise"), 100)
    assert all(c.get("XBLOCK") <= 128 for c in small)


def test_kernel_configs_persistent_keep_rblock():
    k = TritonKernel("softmax", "src", ("a", "b"), (), "512", 4, 1024, 8, "persistent_reduction")
    cfgs = kernel_configs(k, 512)
    assert all(c.get("RBLOCK") == 1024 for c in cfgs)
    assert all(c.get("XBLOCK") * 1024 <= 16384 for c in cfgs[1:])


def test_kernel_configs_looped_and_limit():
    k = TritonKernel("sum", "src", ("a", "b"), ("s0",), "s0", 8, 512, 4, "looped_reduction")
    cfgs = kernel_configs(k, 4096, limit=10)
    assert len(cfgs) == 10 and cfgs[0] == Config.make(num_warps=4, XBLOCK=8, RBLOCK=512)
    assert len({c.get("RBLOCK") for c in cfgs}) > 2


class FakeJit:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.launches.append((grid, kw))
        return run


def test_tune_kernel_applies_the_winner():
    import torch

    k = TritonKernel("add", "src", ("a", "b"), ("s0",), "s0 * 2", 1024, 0, 4, "pointwise")
    a, b = torch.zeros(64), torch.zeros(64)
    timer = FakeTimer({Config.make(num_warps=2, XBLOCK=128).label: 0.1}, default=1.0)
    fn = FakeJit()
    tuned, choice = tune_kernel(k, fn, [a, b, 512], tuner=Autotuner(timer), sizes={"s0": 512},
                                device_name="fake")
    assert (tuned.xblock, tuned.num_warps) == (128, 2) and tuned.name == "add" and not choice.cached
    grids = {g for g, _ in fn.launches}
    assert (1024 // 128, 1, 1) in grids  # xnumel = s0 * 2 evaluated with the sizes
    assert apply_config(k, Config.make(num_warps=8, XBLOCK=256)).xblock == 256


def test_mode_flags():
    assert mode_flags(None) == mode_flags("default") and not mode_flags(None).cudagraphs
    assert mode_flags("reduce-overhead").cudagraphs and not mode_flags("reduce-overhead").autotune
    assert mode_flags("max-autotune").cudagraphs and mode_flags("max-autotune").autotune
    f = mode_flags("max-autotune-no-cudagraphs")
    assert f.autotune and not f.cudagraphs
    with pytest.raises(ValueError, match="unknown mode"):
        mode_flags("fast")


def test_buffers_for_layouts_with_symbolic_sizes():
    import sympy
    import torch

    from kiln.inductor.autotune import buffers_for
    from kiln.inductor.ir import Layout

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    layouts = {"a": Layout((s0, sympy.Integer(4)), (sympy.Integer(4), sympy.Integer(1)), torch.float32),
               "t": Layout((sympy.Integer(4), s0), (sympy.Integer(1), sympy.Integer(4)), torch.bfloat16),
               "idx": Layout((sympy.Integer(8),), (sympy.Integer(1),), torch.int64)}
    bufs = buffers_for(layouts, {"s0": 3}, "cpu")
    assert bufs["a"].numel() == 12 and bufs["a"].dtype == torch.float32
    assert bufs["t"].numel() == 12 and bufs["t"].dtype == torch.bfloat16
    assert bufs["idx"].numel() == 8 and not bufs["idx"].any()  # indices stay in bounds


def test_autotune_program_tunes_every_kernel():
    import sympy
    import torch

    from kiln.inductor.autotune import autotune_program
    from kiln.inductor.ir import Layout

    class Module:
        k_add = FakeJit()
        k_sum = FakeJit()

    class Kernels:  # the shape of codegen.triton.wrapper.TritonKernels
        module = Module()
        generated = [TritonKernel("k_add", "a", ("x", "y"), ("s0",), "s0", 1024, 0, 4, "pointwise"),
                     TritonKernel("k_sum", "b", ("y", "z"), ("s0",), "s0 // 64", 1, 64, 2, "persistent_reduction")]

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    layouts = {n: Layout((s0,), (sympy.Integer(1),), torch.float32) for n in "xyz"}
    best = Config.make(num_warps=2, XBLOCK=256)
    timer = FakeTimer({best.label: 0.1})
    tuned = autotune_program(Kernels(), layouts, {"s0": 4096}, "cpu", tuner=Autotuner(timer))
    assert [k.name for k in tuned] == ["k_add", "k_sum"]
    assert (tuned[0].xblock, tuned[0].num_warps) == (256, 2)
    assert tuned[1].rblock == 64 and Module.k_sum.launches  # every kernel was benchmarked


def test_console_progress_reports_each_tuned_kernel(tmp_path):
    import io

    from kiln.inductor.autotune import ConsoleProgress

    stream = io.StringIO()
    timer = FakeTimer({label(64): 2.0, label(128): 1.0, label(256): 0.5, label(512): 0.9})
    tuner = Autotuner(timer, AutotuneCache(tmp_path / "c.json"), ConsoleProgress(stream))
    tuner.select("kernel_a", "ka", cands())
    tuner.select("kernel_a", "ka", cands())  # cached: silent
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "kernel_a" in lines[0] and "XBLOCK=256" in lines[0] and "4.00x" in lines[0]
