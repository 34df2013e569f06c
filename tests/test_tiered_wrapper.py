"""kiln.compile(options={"wrapper": "tiered"}): inference graphs start on the Python wrapper and move to
the C++ wrapper once a background thread has built it.

Every test calls the compiled program repeatedly with fresh inputs, before and after the move, and
compares with eager; each checks which wrapper the graph's calls go to (``TieredCall.tier``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from torch import nn

import kiln
from kiln.graph import PortableProgram
from kiln.inductor import wait_tiered
from kiln.inductor.codegen.cpp_wrapper.graph_call import OutputPlan
from kiln.inductor.ir import TensorRef
from kiln.inductor.tiered import KEEP_CPP_WITHIN, TieredCall, _differs, live_tiered

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="the C++ wrapper is built with g++")]

TIERED = {"wrapper": "tiered"}
TRIAL = 8  # InductorOptions.tiered_trial_calls' default
MOVE = {"wrapper": "tiered", "tiered_trial_calls": 0}  # no timed trial: the calls move when the library is loaded


def assert_settled(call: TieredCall) -> None:
    """The trial ran both wrappers and the calls stay on the one it measured faster."""
    assert call.measured is not None, call.tier
    python_us, cpp_us = call.measured
    assert call.tier == ("cpp" if cpp_us <= python_us * KEEP_CPP_WITHIN else "python"), (call.tier, call.measured)


class Tiers:
    """The tiered graphs compiled inside the block (``TieredCall.tier``: where their calls go)."""

    def __enter__(self) -> Tiers:
        self.before = {id(c) for c in live_tiered()}
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def calls(self) -> list[TieredCall]:
        return [c for c in live_tiered() if id(c) not in self.before]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(16, 64), nn.Linear(64, 16), nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


def test_graph_moves_to_the_cpp_wrapper_and_matches_eager_before_and_after() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = kiln.compile(model, dynamic=True, options=TIERED)
    with Tiers() as t, torch.no_grad():
        for n in (3, 7, 1):
            x = torch.randn(n, 16)
            torch.testing.assert_close(compiled(x), model(x))
        assert wait_tiered(300)
        assert len(t.calls) == 1 and t.calls[0].ready.is_set() and t.calls[0].tier == "trial"
        for k in range(2 * t.calls[0].trial_calls + 3):  # the trial alternates the wrappers, then the faster
            x = torch.randn((5, 3, 11, 1)[k % 4], 16)
            torch.testing.assert_close(compiled(x), model(x))
        assert_settled(t.calls[0])
        model.fc2.weight.mul_(-1.5)  # the library reads the weights per call: none is baked in
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x))


def test_hf_llama_logits_and_cache_match_eager_on_both_wrappers() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).eval()
    compiled = kiln.compile(model, dynamic=True, options=TIERED)

    def check(b: int, s: int) -> None:
        ids = torch.randint(0, 256, (b, s))
        got, want = compiled(input_ids=ids, use_cache=True), model(input_ids=ids, use_cache=True)
        torch.testing.assert_close(got.logits, want.logits)
        for g, e in zip(got.past_key_values.layers, want.past_key_values.layers):
            torch.testing.assert_close((g.keys, g.values), (e.keys, e.values))

    with Tiers() as t, torch.no_grad():
        check(2, 16)
        check(3, 9)
        assert wait_tiered(300)
        assert t.calls and all(c.tier == "trial" for c in t.calls), [c.tier for c in t.calls]
        for k in range(2 * TRIAL + 1):
            check(*((2, 16), (1, 33), (4, 5))[k % 3])
        for c in t.calls:
            assert_settled(c)


def _train_step(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    model(x).square().sum().backward()
    return [p.grad for p in model.parameters()]


def test_cpu_training_graphs_move_once_hot_and_match_eager() -> None:
    """A CPU graph is tiered by default, its C++ wrapper built only once the graph has been called
    ``tiered_after_calls`` times (KILN_TIER_AFTER_CALLS); the forward and the backward both move, the
    gradients equal eager's before, during and after the trial, and a second model of the same
    architecture (a graph cache hit) shares the graphs, their count and their C++ wrappers."""
    torch.manual_seed(0)
    model, reference = MLP(), MLP()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, options={"tiered_after_calls": 4})

    def check(m: nn.Module = compiled) -> None:
        x = torch.randn(4, 16)
        for g, e in zip(_train_step(m, x), _train_step(reference, x)):
            torch.testing.assert_close(g, e)

    with Tiers() as t:
        for _ in range(3):
            check()
        assert len(t.calls) == 2 and all(c.tier == "python" and not c.ready.is_set() for c in t.calls)
        assert wait_tiered(1)  # nothing queued before the graphs are hot
        check()  # the fourth call of each graph queues its build
        assert wait_tiered(300)
        assert all(c.tier == "trial" for c in t.calls), [c.tier for c in t.calls]
        for _ in range(2 * TRIAL + 1):
            check()
        for c in t.calls:
            assert_settled(c)
        twin = MLP()
        twin.load_state_dict(model.state_dict())
        check(kiln.compile(twin, options={"tiered_after_calls": 4}))
        assert len(t.calls) == 2  # the twin's graphs are the same tiered graphs


def _plan(shape: tuple, stride: tuple, offset: Any = 0, kind: str = "direct") -> OutputPlan:
    return OutputPlan(kind, shape, stride, offset, torch.float32)


def test_layouts_are_compared_as_expressions() -> None:
    s = sympy.Symbol("s0", integer=True, positive=True)
    out = TensorRef("buf0", (s, 16), (16, 1), 0, torch.float32)
    assert _differs([out], [_plan((s, 16), (sympy.Integer(16), 1))]) is None
    assert "strided" in str(_differs([out], [_plan((s, 16), (1, s))]))
    assert "offset" in str(_differs([TensorRef("buf0", (s, 16), (16, 1), 16, torch.float32)], [_plan((s, 16), (16, 1))]))
    assert "returns 2 outputs" in str(_differs([out], [_plan((s, 16), (16, 1))] * 2))
    assert "cannot return output 0" in str(_differs([s], [_plan((s, 16), (16, 1))]))


class _Doubling:
    """A wrapper's ``call_owned``: empties its argument list as the real ones do, counts its calls."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.calls = fail, 0

    def call_owned(self, args: list) -> tuple:
        x = args[0]
        args.clear()
        self.calls += 1
        if self.fail:
            raise RuntimeError("kiln C++ wrapper: Expected Tensor but got None")
        return (x * 2,)


def test_a_cpp_wrapper_failing_in_its_trial_leaves_the_graph_on_the_python_wrapper(
        caplog: pytest.LogCaptureFixture) -> None:
    python, cpp = _Doubling(False), _Doubling(True)
    call = TieredCall(python, "g", trial_calls=2, retry_safe=True)
    call._built(cpp, PortableProgram(""))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"):
        for _ in range(4):  # every call answers, the first C++ one included (run again on Python)
            x = torch.randn(3)
            torch.testing.assert_close(call(x)[0], x * 2)
    assert call.tier == "python" and cpp.calls == 1 and python.calls == 4  # 3 calls + the failed one again
    assert "failed in its trial (RuntimeError: kiln C++ wrapper: Expected Tensor but got None)" in caplog.text


def test_a_failing_cpp_call_of_a_graph_writing_its_inputs_reaches_the_caller() -> None:
    # it may have written some inputs before it failed: running the call again would write them twice
    python, cpp = _Doubling(False), _Doubling(True)
    call = TieredCall(python, "g", trial_calls=2, retry_safe=False)
    call._built(cpp, PortableProgram(""))  # type: ignore[arg-type]
    call(torch.randn(3))  # the trial's first call is the Python wrapper's
    with pytest.raises(RuntimeError, match="Expected Tensor but got None"):
        call(torch.randn(3))
    x = torch.randn(3)  # later calls run on the Python wrapper, not on the failing C++ one again
    torch.testing.assert_close(call(x)[0], x * 2)
    assert call.tier == "python" and cpp.calls == 1


def test_the_build_is_queued_after_the_call_that_makes_the_graph_hot_has_run() -> None:
    # the first call of a GPU graph must not share the GIL with the build (it is the compile time users see)
    events: list[str] = []

    class Recording(_Doubling):
        def call_owned(self, args: list) -> tuple:
            events.append("call")
            return super().call_owned(args)

    call = TieredCall(Recording(False), "g", trial_calls=2, after_calls=2)
    call._start = lambda: events.append("build")
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(call(x)[0], x * 2)
    assert events == ["call", "call", "build", "call"]
    failing = TieredCall(_Doubling(True), "g", trial_calls=2, after_calls=1)
    failing._start = lambda: events.append("queued anyway")
    with pytest.raises(RuntimeError, match="Expected Tensor"):  # a call that raises still queues it
        failing(torch.randn(3))
    assert events[-1] == "queued anyway"


SECOND_PROCESS = textwrap.dedent("""
    import sys
    import torch
    import kiln
    import kiln.runtime.cxx.graph_library as graph_library
    from kiln.graph import EVENTS, GraphCompiled
    from kiln.inductor import wait_tiered
    from kiln.inductor.tiered import live_tiered

    if sys.argv[1] == "load":  # the graph cache's entry is the C++ wrapper's program now: nothing to build
        def refuse(*args, **kwargs):
            raise AssertionError("the C++ wrapper library was built again")
        graph_library.build_model_library = refuse
    seen = []
    EVENTS.subscribe(lambda e: seen.append("_GraphLibrary(" in e.compiled.portable.source)
                     if isinstance(e, GraphCompiled) else None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 3)).eval()
    compiled = kiln.compile(model, dynamic=True, options={"wrapper": "tiered", "tiered_trial_calls": 0})
    with torch.no_grad():
        for n in (4, 7, 1):
            x = torch.randn(n, 12)
            torch.testing.assert_close(compiled(x), model(x))
        assert wait_tiered(300)
        for n in (5, 2):
            x = torch.randn(n, 12)
            torch.testing.assert_close(compiled(x), model(x))
    tiers = [c.tier for c in live_tiered()]
    print("ok", seen, tiers)
""")


def test_later_processes_load_the_cpp_wrapper_from_the_graph_cache(tmp_path: Path) -> None:
    """The first process compiles the Python wrapper and moves to the C++ one; the graph cache's entry is then
    replaced by the C++ wrapper's program, which a second process loads without building anything."""
    script = tmp_path / "second.py"
    script.write_text(SECOND_PROCESS)
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_GRAPH_CACHE": "1"}
    outs = []
    for mode, limit in (("build", 600), ("load", 300)):
        run = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                             timeout=limit)
        assert run.returncode == 0, (mode, run.stderr[-3000:])
        outs.append(run.stdout.strip())
    # first: compiled as the Python wrapper, then moved; second: the C++ wrapper from the cache, no tier-up
    assert outs == ["ok [False] ['cpp']", "ok [True] []"], outs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_hf_gpt2_generate_on_cuda_gives_eager_tokens_on_every_wrapper(caplog: pytest.LogCaptureFixture) -> None:
    """On the GPU: HF GPT-2's generate() (three graphs, the decode ones symbolic in the cache length) gives
    eager's tokens before and after its graphs moved (their C++ wrappers built on the background thread, cubins
    and model.so loaded there while the main thread runs; kiln_graph's attention op of the symbolic decode
    graphs runs there as the ATen composite). A graph the C++ wrapper cannot run keeps the Python wrapper and
    says why."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=256,
                                     attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).cuda().eval()

    def generate(ids: torch.Tensor) -> torch.Tensor:
        return model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)

    prompts = [torch.randint(1, 512, (2, 16), device="cuda") for _ in range(3)]
    hints = logging.getLogger("kiln.perf_hints")
    hints.propagate = True
    try:
        with torch.no_grad(), caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
            want = [generate(p) for p in prompts]
            model.forward = kiln.compile(model.forward, options=MOVE)
            with Tiers() as t:
                assert torch.equal(generate(prompts[0]), want[0])
                assert wait_tiered(600)
                for p, w in zip(prompts, want):
                    assert torch.equal(generate(p), w)
    finally:
        hints.propagate = False
    tiers = [c.tier for c in t.calls]
    assert tiers and all(c.ready.is_set() for c in t.calls), tiers
    kept = tiers.count("python")
    assert tiers.count("cpp") + kept == len(tiers), tiers
    assert caplog.text.count("keeps the Python wrapper (wrapper='tiered')") >= kept, (tiers, caplog.text[-3000:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inference_graphs_are_tiered_by_default_and_match_eager() -> None:
    """kiln.compile gives a CUDA inference graph in default mode the tiered wrapper unless its options name
    a wrapper; a training graph and a reduce-overhead graph keep the Python wrapper."""
    torch.manual_seed(0)
    model = MLP().cuda()
    xs = [torch.randn(8, 16, device="cuda") for _ in range(4)]
    with Tiers() as default, torch.no_grad():
        f = kiln.compile(model)
        assert torch.allclose(f(xs[0]), model(xs[0]), atol=1e-5)
        assert wait_tiered(300)
        for x in xs:
            assert torch.allclose(f(x), model(x), atol=1e-5)
    assert len(default.calls) == 1 and default.calls[0].ready.is_set()
    with Tiers() as named, torch.no_grad():
        kiln.compile(model, options={"wrapper": "python"})(xs[0])
        kiln.compile(model, mode="reduce-overhead")(xs[0])
    with Tiers() as training:
        kiln.compile(model)(xs[0].requires_grad_()).sum().backward()
    assert named.calls == [] and training.calls == []


class _Wrapper:
    """A stand-in wrapper that takes ``seconds`` a call and counts its calls."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def call_owned(self, args: list) -> tuple:
        self.calls += 1
        time.sleep(self.seconds)
        return (len(args),)


@pytest.mark.parametrize("python_s, cpp_s, kept", [(0.004, 0.0, "cpp"), (0.0, 0.004, "python")])
def test_the_trial_keeps_the_wrapper_measured_faster(python_s: float, cpp_s: float, kept: str) -> None:
    python, cpp = _Wrapper(python_s), _Wrapper(cpp_s)
    call = TieredCall(python, "g", trial_calls=3)
    handed: list[object] = []
    call.later(handed.append)
    call._built(cpp, PortableProgram("cpp program"))  # type: ignore[arg-type]
    assert call.tier == "trial"
    for k in range(6):
        assert call(1, 2, k) == (3,)  # each call runs once, on one wrapper
    assert (python.calls, cpp.calls) == (3, 3)
    assert call.tier == kept and call.measured is not None
    for _ in range(4):
        call(1)
    assert (python.calls, cpp.calls) == ((7, 3) if kept == "python" else (3, 7))
    wait_tiered(30)  # the program is handed on on the build thread
    assert handed == ([PortableProgram("cpp program")] if kept == "cpp" else [])


class _Device:
    """A stand-in GPU: work queued by a call runs on after it returns, until ``sync`` waits for it."""

    def __init__(self) -> None:
        self.pending = 0.0

    def sync(self) -> None:
        time.sleep(self.pending)
        self.pending = 0.0


class _Launcher(_Wrapper):
    """A wrapper spending ``seconds`` of host time and queueing ``device_s`` of kernels a call."""

    def __init__(self, seconds: float, device_s: float, device: _Device) -> None:
        super().__init__(seconds)
        self.device_s, self.device = device_s, device

    def call_owned(self, args: list) -> tuple:
        self.device.pending += self.device_s
        return super().call_owned(args)


@pytest.mark.parametrize("synced, kept", [(True, "python"), (False, "cpp")])
def test_a_gpu_graphs_trial_times_its_kernels(synced: bool, kept: str) -> None:
    """A GPU graph whose C++ wrapper spends less host time but queues slower kernels: timed from an idle device
    to its kernels' end, the trial keeps the Python wrapper (on host time alone it moved to the slower one)."""
    device = _Device()
    python, cpp = _Launcher(0.001, 0.002, device), _Launcher(0.0, 0.008, device)
    call = TieredCall(python, "g", trial_calls=3, sync=device.sync if synced else None)
    call._built(cpp, PortableProgram("cpp program"))  # type: ignore[arg-type]
    for k in range(6):
        assert call(k) == (1,)
    assert call.tier == kept, call.measured


def test_calls_from_several_threads_through_the_trial() -> None:
    """Threads calling while the trial settles: every call runs once on one wrapper, none fails."""
    import threading

    python, cpp = _Wrapper(0.001), _Wrapper(0.0)
    call = TieredCall(python, "g", trial_calls=3)
    call._built(cpp, PortableProgram("cpp program"))  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for k in range(10):
                assert call(k) == (1,)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert python.calls + cpp.calls == 40 and call.tier in ("cpp", "python")


def test_no_build_runs_while_the_program_still_compiles() -> None:
    """A training program's forward is compiled before its backward, both over the joint trace's fake tensor
    mode, which is not thread-safe: a build of the forward's C++ wrapper started at its compile ran passes in
    that mode beside the backward's compile ("AssertionError: False, True" in one thread, now and then).
    Builds start at a graph's first call, when the whole program is compiled; the steps still match eager
    and both graphs settle on a wrapper."""
    from cpp_wrapper_helpers import step_as_eager

    from kiln.graph import EVENTS, GraphCompiled
    from kiln.inductor.tiered import _BUILDS

    pending: list[int] = []

    def at_compile(event: object) -> None:
        if isinstance(event, GraphCompiled):
            pending.append(_BUILDS.pending)

    torch.manual_seed(0)
    eager = MLP()
    model = MLP()
    model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(model, options={"wrapper": "tiered", "tiered_trial_calls": 2})
    EVENTS.subscribe(at_compile)
    try:
        with Tiers() as t:
            for step in range(8):
                step_as_eager(eager, model, compiled, torch.randn(5, 16), step)
                if step == 0:
                    assert wait_tiered(300)
    finally:
        EVENTS.unsubscribe(at_compile)
    assert pending == [0], pending  # nothing queued while the program compiled
    assert len(t.calls) == 2 and all(c.tier in ("cpp", "python") for c in t.calls), [c.tier for c in t.calls]
