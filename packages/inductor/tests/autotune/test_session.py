"""One compile's max-autotune session (autotune/session.py): identical layers tuned once, every
candidate compiled in one batch before any is timed, the time budget, the margin rule, pruning.

On CPU the kernels run in the Triton interpreter and a FakeTimer (with a fake clock for the budget)
decides; a recording compiler stands in for the parallel compile, which is checked for real by
compiling for a CUDA target without a GPU (``test_cross_compile_for_a_cuda_target``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.autotune import (
    AutotuneCache,
    AutotuneOptions,
    Autotuner,
    Candidate,
    CompileStats,
    Config,
    FakeTimer,
    NoCompile,
    Problem,
    TuningSession,
    normalized_source,
)
from kiln.inductor.autotune.matmul_template_kernel import (
    MatmulSpec,
    Operand,
    smem_bytes,
    smem_limit,
    template_configs,
)

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Events:
    """One ordered log of compile batches and timings."""

    def __init__(self) -> None:
        self.seq: list[tuple[str, object]] = []


class RecordingCompiler(NoCompile):
    def __init__(self, events: Events) -> None:
        self.events = events
        self.batches: list[int] = []

    def __call__(self, jobs, deadline):  # type: ignore[override]
        stats = super().__call__(jobs, deadline)
        self.batches.append(stats.jobs)
        self.events.seq.append(("compile", stats.jobs))
        return stats


class RecordingTimer(FakeTimer):
    def __init__(self, events: Events, times, default=0.5, clock=None, step=0.0) -> None:
        super().__init__(times, default)
        self.events, self.clock, self.step = events, clock, step

    def __call__(self, launch, label):  # type: ignore[override]
        self.events.seq.append(("time", label))
        if self.clock is not None:
            self.clock.now += self.step
        return super().__call__(launch, label)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def opts(tmp_path, timer, compiler, **kw) -> InductorOptions:
    at = AutotuneOptions(timer=timer, compiler=compiler, cache_root=str(tmp_path / "cache"), progress=False,
                         **{"matmul_configs": 2, "kernel_configs": 2, **kw})
    return InductorOptions(cpu_backend="triton", max_autotune=True, autotune=at)


def layers(n: int):
    def fn(x, *wb):
        for i in range(n):
            x = torch.tanh(F.linear(x, wb[2 * i], wb[2 * i + 1]))
            x = x - x.mean(-1, keepdim=True)  # a reduction kernel per layer (12 identical ones)
        return (x,)
    return fn


def layer_args(n: int, d: int = 32):
    args = [torch.randn(16, d, device=DEV)]
    for _ in range(n):
        args += [torch.randn(d, d, device=DEV) * 0.1, torch.randn(d, device=DEV)]
    return args


@needs_triton
def test_twelve_identical_layers_tune_once_and_compile_in_one_batch(tmp_path):
    events = Events()
    timer = RecordingTimer(events, {"cublas": 1.0})  # templates (0.5) win
    compiler = RecordingCompiler(events)
    args = layer_args(12)
    fn = layers(12)
    cg = compile_graph(trace(fn, *args), args, options=opts(tmp_path, timer, compiler))
    torch.testing.assert_close(cg.fn(*args)[0], fn(*args)[0], rtol=1e-4, atol=1e-4)
    src = cg.texts["output_code"]
    assert src[src.index("\ndef call(args):"):].count("_launch_tmpl_addmm") == 12  # every layer got it
    assert timer.timed.count("cublas") == 1  # one matmul problem for the 12 layers
    # every candidate of the whole program compiled in one batch, before anything was timed
    assert len(compiler.batches) == 1 and events.seq[0][0] == "compile"
    assert all(kind == "time" for kind, _ in events.seq[1:])
    # the 12 layers' identical kernels are one problem each: at most a handful of kernels were timed
    kernel_timings = [lbl for lbl in timer.timed if "XBLOCK" in lbl]
    assert 0 < len(kernel_timings) <= 2 * 2  # at most 2 distinct kernels x 2 configurations


@needs_triton
def test_budget_cutoff_keeps_defaults_and_says_so(tmp_path, caplog):
    events = Events()
    clock = FakeClock()
    timer = RecordingTimer(events, {"cublas": 1.0}, clock=clock, step=10.0)  # each timing "takes" 10 s
    fn = lambda x, w1, b1, w2: (torch.relu(F.linear(x, w1, b1)) @ w2.t(),)  # noqa: E731 - two distinct matmuls
    args = [torch.randn(16, 32, device=DEV), torch.randn(24, 32, device=DEV), torch.randn(24, device=DEV),
            torch.randn(40, 24, device=DEV)]
    o = opts(tmp_path, timer, RecordingCompiler(events), budget_s=25.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        cg = compile_graph(trace(fn, *args), args, options=o)
    torch.testing.assert_close(cg.fn(*args)[0], fn(*args)[0], rtol=1e-4, atol=1e-4)
    # the first matmul's 3 candidates took 30 s > 25 s: the second keeps cuBLAS untimed, kernels too
    assert timer.timed.count("cublas") == 1 and len(timer.timed) == 3
    msgs = [r.getMessage() for r in caplog.records]
    assert any("budget of 25 s" in m and "KILN_AUTOTUNE_BUDGET_S" in m and "keep their defaults" in m for m in msgs)
    call = cg.texts["output_code"]
    assert "_launch_tmpl_" in call and "aten.mm" in call
    # untimed defaults are not cached: a compile with budget left tunes what was cut off
    timer2 = RecordingTimer(Events(), {"cublas": 1.0})
    compile_graph(trace(fn, *args), args, options=opts(tmp_path, timer2, RecordingCompiler(Events())))
    assert timer2.timed.count("cublas") == 1  # the second matmul only; the first comes from the cache


def test_margin_rule_keeps_the_default_within_three_percent():
    assert AutotuneOptions().margin == 0.03 and Autotuner(FakeTimer({})).margin == 0.03
    default, other = Config(extern="cublas"), Config.make(num_warps=4, BLOCK_M=64)

    def pick(other_ms: float) -> Config:
        cands = [Candidate(default, lambda: None, is_default=True), Candidate(other, lambda: None)]
        return Autotuner(FakeTimer({"cublas": 1.0, other.label: other_ms})).measure("mm", "k", cands).config

    assert pick(0.98) == default  # 2% faster: noise, the default stays
    assert pick(0.975) == default
    assert pick(0.96) == other  # 4% faster: chosen
    assert pick(1.5) == default


def test_session_dedups_and_never_times_a_cached_problem(tmp_path):
    events = Events()
    timer = RecordingTimer(events, {"XBLOCK=2,warps=4,stages=1": 0.1}, default=1.0)
    session = TuningSession(Autotuner(timer, AutotuneCache(tmp_path)), RecordingCompiler(events))
    configs = [Config.make(XBLOCK=1), Config.make(XBLOCK=2)]
    made = []

    def problem(name: str) -> Problem:
        return Problem(name, "same-key", "kernel", configs, lambda c: (lambda: made.append(c)), lambda: [])

    a, b = session.add(problem("layer0")), session.add(problem("layer1"))
    assert a is b and a.uses == 2 and session.report.problems == 1 and session.report.sites == 2
    session.run()
    assert session.choice(a).config == configs[1] and len(timer.timed) == 2
    again = TuningSession(Autotuner(timer, AutotuneCache(tmp_path)), RecordingCompiler(events))
    p = again.add(problem("layer0"))
    again.run()
    assert p.choice is not None and p.choice.cached and len(timer.timed) == 2
    assert again.report.cached == 1 and again.report.compile.jobs == 0


def test_compile_only_session_times_nothing():
    timer = FakeTimer({})
    session = TuningSession(Autotuner(timer), RecordingCompiler(Events()), can_time=False)
    p = session.add(Problem("k", "key", "kernel", [Config.make(XBLOCK=1), Config.make(XBLOCK=2)],
                            lambda c: (lambda: None), lambda: []))
    session.run()
    assert timer.timed == [] and p.defaulted == "compile-only" and session.choice(p).config == p.default
    assert "2 candidates" in session.finish().line()


def test_normalized_source_ignores_names():
    a = "@triton.jit\ndef k12_add(ptr_buf3, ptr_arg0, XBLOCK: tl.constexpr):\n    # buf3\n    x = tl.load(ptr_arg0)\n"
    b = "@triton.jit\ndef k40_add(ptr_buf9, ptr_arg7, XBLOCK: tl.constexpr):\n    # buf9\n    x = tl.load(ptr_arg7)\n"
    c = "@triton.jit\ndef k40_add(ptr_buf9, ptr_arg7, XBLOCK: tl.constexpr):\n    x = tl.load(ptr_buf9)\n"
    assert normalized_source(a) == normalized_source(b) != normalized_source(c)


def spec(m: int, n: int, k: int, dtype=torch.float32) -> MatmulSpec:
    return MatmulSpec("mm", 1, m, n, k, Operand("a", 0, (0, k, 1)), Operand("b", 0, (0, n, 1)), None,
                      Operand("c", 0, (0, n, 1)), dtype)


def test_template_configs_are_pruned_before_compiling():
    big = spec(4096, 4096, 4096)
    everything = template_configs(big)
    sm90, sm86 = template_configs(big, smem=smem_limit("cpu", "cuda:90")), template_configs(big, smem=101376)
    assert len(sm86) < len(sm90) < len(everything)  # fp32 pipelines that do not fit are dropped
    assert all(smem_bytes(c, torch.float32) <= 101376 for c in sm86)
    assert smem_limit("cpu", "cuda:80") == 166912
    tiny = template_configs(spec(16, 16, 16), smem=smem_limit("cpu"))
    assert all(c.get("BLOCK_M") == 16 and c.get("BLOCK_N") == 16 and c.get("BLOCK_K") == 16 for c in tiny)
    assert len(tiny) < len(everything) and all(c.num_warps <= 1 for c in tiny)  # 256-element tiles


CROSS = textwrap.dedent("""
    import json, logging, sys, torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    sys.path.insert(0, sys.argv[1])
    from tracer import trace
    from kiln.inductor import InductorOptions, compile_graph
    from kiln.inductor.autotune import AutotuneOptions
    reports = []
    class H(logging.Handler):
        def emit(self, r):
            if hasattr(r, "kiln_autotune_report"):
                reports.append(r.kiln_autotune_report)
    lg = logging.getLogger("kiln.perf_hints"); lg.addHandler(H()); lg.setLevel(logging.INFO)
    fn = lambda x, w1, b1, w2, b2: (F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2).softmax(-1),)
    args = [torch.randn(64, 64), torch.randn(64, 64), torch.randn(64), torch.randn(64, 64), torch.randn(64)]
    gm = trace(fn, *args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(a.to(torch.bfloat16)).to("cuda") for a in args]
    at = AutotuneOptions(cross_target="cuda:90", matmul_configs=1, kernel_configs=2,
                         cache_root=sys.argv[2], progress=False)
    cg = compile_graph(gm, fake, options=InductorOptions(max_autotune=True, autotune=at))
    r = reports[-1]
    print(json.dumps({"sites": r.sites, "problems": r.problems, "jobs": r.compile.jobs, "failed": r.compile.failed,
                      "mode": r.compile.mode, "timed": r.timed_candidates, "kinds": r.kinds,
                      "addmm": "aten.addmm" in cg.texts["output_code"]}))
""")


def test_cross_compile_for_a_cuda_target(tmp_path):
    """Without a GPU, KILN_AUTOTUNE_CROSS_TARGET compiles every candidate for the target (for real:
    triton compiles to a cubin) on the thread pool and times nothing; the externs stay."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("cross-compiling is for hosts without a GPU")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    tests = os.path.dirname(os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", CROSS, tests, str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["kinds"]["matmul"] == 2 and r["kinds"]["kernel"] >= 1
    assert r["mode"] == "process" and r["failed"] == 0 and r["timed"] == 0 and r["addmm"]
    assert r["jobs"] >= 2 + 2  # two matmuls' templates (1 configuration each), kernels' configurations


def test_compile_stats_add():
    a = CompileStats(jobs=3, compiled=2, failed=1, seconds=1.0, workers=4, mode="async")
    a.add(CompileStats(jobs=2, compiled=2, seconds=0.5, workers=2))
    assert (a.jobs, a.compiled, a.failed, a.workers, a.mode) == (5, 4, 1, 4, "async") and a.seconds == 1.5
