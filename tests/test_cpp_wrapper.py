"""kiln.compile(options={"wrapper": "cpp"}): inference graphs run as a C++ wrapper library.

Every test calls the compiled program repeatedly with fresh inputs and compares with eager; each also
checks which wrapper ran (the compiled program's source names the C++ library, or perf_hints says why
the Python wrapper kept the graph).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_wrapper_helpers import CPP, Block, Wrappers, _call_peak
from torch import nn

import kiln

# slow: each test builds C++ against libtorch's headers, and nothing here depends on the Python version's
# bytecode (capture's part is tested on every version elsewhere): the default Python runs them
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="the C++ wrapper is built with g++")]

def test_transformer_block_matches_eager_over_fresh_inputs() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert w.graphs == [True]


@pytest.mark.slow
def test_hf_llama_with_kv_cache_matches_eager() -> None:
    """HF Llama (tiny config) returning logits and its KV cache (concatenations, several outputs)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).eval()
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 256, (2, 16))
            got, want = compiled(input_ids=ids, use_cache=True), model(input_ids=ids, use_cache=True)
            torch.testing.assert_close(got.logits, want.logits)
            for g, e in zip(got.past_key_values.layers, want.past_key_values.layers):
                torch.testing.assert_close((g.keys, g.values), (e.keys, e.values))
    assert w.graphs and all(w.graphs), w.graphs


def test_hf_gpt2_peak_memory_is_the_python_wrappers() -> None:
    """Issue #24: a multi-layer GPT-2's C++ wrapper held buffers the memory plan had handed over (written in
    place) until the call returned, several activations above the Python wrapper's peak; now the same."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=6, n_embd=128, n_head=4, vocab_size=64, n_positions=256,
                                     attn_implementation="eager")
    model = transformers.GPT2Model(config).eval()

    def hidden(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).last_hidden_state

    cpp, python = kiln.compile(hidden, options=CPP), kiln.compile(hidden)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 64, (2, 256))
            want = hidden(ids)
            peak, got = _call_peak(cpp, ids)
            reference, from_python = _call_peak(python, ids)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(from_python, want, rtol=1e-4, atol=1e-4)
            assert peak <= reference + 64 * 1024, (peak, reference)
    assert w.graphs.count(True) == 1, w.graphs

def test_parameters_updated_in_place_or_replaced_are_seen() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for step in range(3):
            x = torch.randn(5, 16)
            torch.testing.assert_close(compiled(x), model(x))
            model[0].weight.mul_(0.5).add_(0.1)  # an optimizer-style update in place
            model[2].bias.fill_(float(step))
        model[2].weight = nn.Parameter(torch.randn(4, 16))  # replaced: new memory
        x = torch.randn(5, 16)
        torch.testing.assert_close(compiled(x), model(x))
    assert w.graphs and all(w.graphs)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)


def test_batchnorm_in_eval_matches_eager() -> None:
    torch.manual_seed(0)
    model = ConvBN()
    with torch.no_grad():  # statistics that are not the identity
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 10, 10)
            torch.testing.assert_close(compiled(x), model(x))
    assert w.graphs == [True]


def test_batchnorm_statistics_updated_under_no_grad() -> None:
    """Training-mode BatchNorm under no_grad: an inference graph whose running statistics are inputs it
    updates in place (written back after each call)."""
    torch.manual_seed(0)
    model = ConvBN().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 6, 6)
            torch.testing.assert_close(compiled(x), reference(x))
            torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
            torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)
            assert int(model.bn.num_batches_tracked) == int(reference.bn.num_batches_tracked)
    assert w.graphs == [True]


class Cache(nn.Module):
    """A KV-cache-style buffer written at a position per call (index_copy_), and a call counter."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(6, 8))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, pos, self.lin(x))
        self.calls.add_(1)
        return self.cache.sum(0) * 2


def test_buffers_updated_in_place_match_eager() -> None:
    torch.manual_seed(0)
    model = Cache().eval()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options=CPP)
    cache = model.cache
    with Wrappers() as w, torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(1, 8), torch.tensor([step])
            torch.testing.assert_close(compiled(x, pos), reference(x, pos))
            torch.testing.assert_close(model.cache, reference.cache)
            assert int(model.calls) == int(reference.calls) == step + 1
    assert model.cache is cache
    assert w.graphs == [True]


def test_output_views_of_an_input_alias_it() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x * 2 + 1
        return x.view(-1)[2:7], y, y.t()

    compiled = kiln.compile(f, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 5)
            got, want = compiled(x), f(x)
            for g, e in zip(got, want):
                torch.testing.assert_close(g, e)
                assert g.stride() == e.stride()
            assert got[0].data_ptr() == want[0].data_ptr()  # a view of x, as in eager
            x.view(-1)[3] = 100.0
            assert float(got[0][1]) == 100.0
            assert got[2].data_ptr() == got[1].data_ptr()  # y.t() views y
    assert w.graphs == [True]


def test_outputs_at_an_offset_keep_their_layout() -> None:
    """Outputs that are views into the middle of a buffer the graph needs anyway: the caller lays each out
    with the view's strides and storage offset, as the Python wrapper (and eager) return them."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x @ x.t()
        return y[1:], y.sum(), y.t()[1:, 2:]

    compiled = kiln.compile(f, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 5)
            for g, e in zip(compiled(x), f(x)):
                torch.testing.assert_close(g, e)
                assert (g.stride(), g.storage_offset()) == (e.stride(), e.storage_offset())
    assert w.graphs == [True]


def test_matmul_output_is_the_matmuls_result() -> None:
    """A head's matmul whose result is the output (reshaped): the library hands over ATen's result."""
    torch.manual_seed(0)
    head = nn.Linear(16, 64, bias=False).eval()
    compiled = kiln.compile(lambda h: head(h), options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            h = torch.randn(2, 5, 16)
            got = compiled(h)
            torch.testing.assert_close(got, head(h))
            assert got.shape == (2, 5, 64) and got.is_contiguous()
    assert w.graphs == [True]


@torch.library.custom_op("kiln_test::cpp_wrapper_sin", mutates_args=())
def python_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@python_sin.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_graph_the_cpp_path_refuses_falls_back_logged(caplog: pytest.LogCaptureFixture) -> None:
    """An op a Python library registered cannot be called from C++: the graph keeps the Python wrapper,
    perf_hints says why, and the results are right."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kiln_test.cpp_wrapper_sin(x * 3).relu() + 1

    compiled = kiln.compile(f, options=CPP)
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"), Wrappers() as w, torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 7)
            torch.testing.assert_close(compiled(x), f(x))
    assert w.graphs == [False]
    hints = [r.getMessage() for r in caplog.records if r.name == "kiln.perf_hints"]
    assert any("keeps the Python wrapper" in m and "cpp_wrapper_sin" in m for m in hints), hints


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(24, 48), nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = nn.functional.gelu(self.fc1(x))
        return self.fc2(h), h[:, -1].sum(-1)  # the second: a reduction over a view at a symbolic offset


# (batch, sequence): the first compiles static, the second symbolic (automatic dynamic), batch 1 its own
# (a size of 1 is specialised, as torch.compile does); the symbolic one serves the other five
SIZES = [(2, 8), (3, 16), (1, 5), (4, 33), (8, 64), (5, 13), (2, 9)]
COMPILES = [True, False] * 2  # per size that compiles (the first, then the second: symbolic, batch 1 included): the
# C++ wrapper's graph, then the Python wrapper's


def test_symbolic_mlp_one_library_serves_every_size() -> None:
    """Batch and sequence vary: one symbolic C++ library serves every size after the first, with outputs
    equal to eager's and to the Python wrapper's."""
    torch.manual_seed(0)
    model = MLP().eval()
    compiled, python = kiln.compile(model, options=CPP), kiln.compile(model)
    with Wrappers() as w, torch.no_grad():
        for b, t in SIZES:
            x = torch.randn(b, t, 24)
            got, want = compiled(x), model(x)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(got, python(x))
            assert [st for n, st in zip(got[0].shape, got[0].stride()) if n > 1] == \
                [st for n, st in zip(want[0].shape, want[0].stride()) if n > 1]
    assert w.graphs == COMPILES, w.graphs


@pytest.mark.slow
def test_symbolic_hf_llama_one_library_serves_every_size() -> None:
    """The dynamic serving stream's model (HF Llama, use_cache=False), tiny: batch 1-8, sequence 5-64."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).eval()
    compiled, python = kiln.compile(model, options=CPP), kiln.compile(model)
    with Wrappers() as w, torch.no_grad():
        for b, t in SIZES:
            ids = torch.randint(0, 256, (b, t))
            got = compiled(input_ids=ids, use_cache=False).logits
            torch.testing.assert_close(got, model(input_ids=ids, use_cache=False).logits)
            torch.testing.assert_close(got, python(input_ids=ids, use_cache=False).logits)
    assert w.graphs == COMPILES, w.graphs


def test_symbolic_int_input_is_a_size_argument() -> None:
    """A graph that takes a SymInt (an int argument that varies): the library reads that size from it. At
    n = 12 (the whole row) capture compiles a graph specialised to that int, which takes it unread."""
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return (x[:, :n] * 2 + torch.arange(n)).cumsum(0)

    compiled = kiln.compile(f, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for b, n in [(2, 3), (3, 5), (4, 7), (5, 2), (6, 9), (8, 11), (7, 4), (8, 12), (3, 12)]:
            x = torch.randn(b, 12)
            torch.testing.assert_close(compiled(x, n), f(x, n))
    assert w.graphs == [True, True, True], w.graphs
    assert ", 1, -1]" in w.sources[1]  # the symbolic graph's size argument read from input 1, an int


def test_inputs_live_until_the_library_returns() -> None:
    """call_owned empties its argument list, and the library reads the inputs by pointer: an input whose
    only reference was the list must outlive the call (else the matmul's result may be allocated over it)."""
    from kiln.inductor import InductorOptions, compile_graph, to_aten

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x) + x

    x = torch.randn(64, 64)
    graph = compile_graph(to_aten(torch.fx.symbolic_trace(f), [x]), [x], options=InductorOptions(wrapper="cpp"))
    assert "_GraphLibrary(" in graph.portable.source
    for _ in range(5):
        x = torch.randn(64, 64)
        want = f(x)
        args = [x]
        del x
        (got,) = graph.fn.call_owned(args)
        assert args == []
        torch.testing.assert_close(got, want)


SECOND_PROCESS = textwrap.dedent("""
    import sys, time
    import torch
    import kiln
    import kiln.runtime.cxx.graph_library as graph_library
    from kiln.graph import EVENTS, GraphCompiled

    if sys.argv[1] == "load":  # this process must build nothing: the compile cache has the library
        def refuse(*args, **kwargs):
            raise AssertionError("the C++ wrapper library was built again")
        graph_library.build_model_library = refuse
    seen = []
    EVENTS.subscribe(lambda e: seen.append("_GraphLibrary(" in e.compiled.portable.source)
                     if isinstance(e, GraphCompiled) else None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 3)).eval()
    compiled = kiln.compile(model, options={"wrapper": "cpp"})
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 12)
            torch.testing.assert_close(compiled(x), model(x))
    assert seen == [True], seen
    print(f"ok {time.perf_counter() - t0:.2f}")
""")


def _cache_with_the_sessions_support(cache: Path) -> Path:
    """A new compile cache at ``cache`` that starts as a copy of this session's: the support library (~20 CPU-s
    of g++ over libtorch's headers) and the kernels' precompiled header other tests built, not this graph."""
    session = Path(os.environ.get("KILN_CACHE_DIR", ""))
    if session.is_dir():
        try:  # another worker may write the session's cache meanwhile: its temp files come and go
            shutil.copytree(session, cache, symlinks=True, ignore=shutil.ignore_patterns(".tmp-*"))
        except shutil.Error:
            pass  # a file that vanished while copied: this cache builds it, as a new one would
    return cache


def test_library_reused_from_the_cache_in_a_second_process(tmp_path: Path) -> None:
    """Later processes load the built library, without running g++: from the graph cache's entry, and
    with the graph cache off, from the compile cache's library build."""
    script = tmp_path / "second.py"
    script.write_text(SECOND_PROCESS)
    env = {**os.environ, "KILN_CACHE_DIR": str(_cache_with_the_sessions_support(tmp_path / "cache"))}
    for mode, graph_cache, limit in (("build", "1", 600), ("load", "1", 300), ("load", "0", 300)):
        run = subprocess.run([sys.executable, str(script), mode], env={**env, "KILN_GRAPH_CACHE": graph_cache},
                             capture_output=True, text=True, timeout=limit)
        assert run.returncode == 0, (mode, graph_cache, run.stderr[-3000:])
        assert run.stdout.startswith("ok")


CUDA_BUILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {example!r})
    import torch
    import kiln
    from kiln.deploy import _graph_for
    from kiln.inductor import InductorOptions
    from kiln.inductor.cpp_graph import build_cpp_graph
    from models import example
    model, inputs = example("transformer", small=True)
    graph, fake_cuda_inputs = _graph_for(kiln.export(model, inputs), "cuda")
    built = build_cpp_graph(graph, fake_cuda_inputs, options=InductorOptions(wrapper="cpp"), cuda_arch=90)
    wrapper = built.program.wrapper_source
    print(json.dumps({{"files": sorted(built.files), "cubins": [c.file_name for c in built.program.cubins],
                      "pdl": [c.pdl for c in built.program.cubins], "pdl_rows": wrapper.count(", 1}},  // "),
                      "plan": [p.as_json() for p in built.plan], "n_inputs": len(fake_cuda_inputs),
                      "wraps": wrapper.count("kiln_rt::wrap(dev, inputs["),
                      "pointers": wrapper.count("kiln_rt::aligned_data(dev, inputs["), "launches": wrapper.count("  launch("),
                      "constants": wrapper.count("constants["), "source": built.source}}))
""")


@pytest.mark.slow
def test_cuda_library_builds_without_a_gpu(tmp_path: Path) -> None:
    """A CUDA graph (fake CUDA tensors) builds into a library of sm_90 cubins on this CPU machine, every
    input (the weights too) passed per call; run on a GPU by the gpu tests below."""
    try:
        import kiln.runtime.cxx as cxx
        cxx.cuda_include_dirs()
        cxx.ldflags(cuda=True)
    except Exception as e:  # noqa: BLE001 - a torch without CUDA headers or libraries
        pytest.skip(f"CUDA libraries cannot be built with this torch: {e}")
    example = Path(__file__).resolve().parents[1] / "examples" / "deploy_cpp"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # cubins need triton's compiler
    env["KILN_CACHE_DIR"] = str(_cache_with_the_sessions_support(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", CUDA_BUILD.format(example=str(example))], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["cubins"] and got["files"] == sorted(["model.so", *(f"kernels/{c}" for c in got["cubins"])])
    assert got["launches"] >= len(got["cubins"]) and got["constants"] == 0
    # launched with programmatic dependent launch (each kernel waits for the one before it: pdl.py)
    assert got["pdl"] == [True] * len(got["cubins"])
    assert got["pdl_rows"] == len(got["cubins"])  # KernelInfo::pdl in the C++ table
    # every input wrapped, or (read by kernels only) its pointer, checked for alignment per call
    assert got["wraps"] + got["pointers"] == got["n_inputs"] and got["pointers"] >= 1
    assert all(kind in ("direct", "copy") for kind, *_ in got["plan"])
    assert "'cuda:0'" in got["source"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_llama_bf16_on_cuda_matches_eager() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    compiled = kiln.compile(model, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 512, (2, 32), device="cuda")
            got = compiled(input_ids=ids, use_cache=False).logits
            want = model(input_ids=ids, use_cache=False).logits
            scale = want.float().abs().max().item()
            torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2 * max(scale, 1.0))
    assert w.graphs and all(w.graphs), w.graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_buffers_updated_in_place_and_batchnorm_statistics() -> None:
    """On the GPU: a KV-cache-style buffer written in place (returned as the input, not copied; a
    misaligned one is realigned first), and BatchNorm statistics updated under no_grad."""
    torch.manual_seed(0)
    model = Cache().cuda().eval()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options=CPP)
    bn = ConvBN().cuda().train()
    bn_reference = copy.deepcopy(bn)
    bn_compiled = kiln.compile(bn, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(1, 8, device="cuda"), torch.tensor([step], device="cuda")
            torch.testing.assert_close(compiled(x, pos), reference(x, pos))
            torch.testing.assert_close(model.cache, reference.cache)
            y = torch.randn(4, 3, 6, 6, device="cuda")
            torch.testing.assert_close(bn_compiled(y), bn_reference(y))
            torch.testing.assert_close(bn.bn.running_var, bn_reference.bn.running_var)
    assert w.graphs == [True, True], w.graphs


ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_GPU)])
def test_misaligned_input_written_in_place(device: str) -> None:
    """A cache that starts 4 bytes into its storage, written in place: on CUDA the library's kernels want
    16-byte aligned memory, so it is written in an aligned copy and copied back; the caller's tensor
    holds the update."""
    def f(cache: torch.Tensor, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, x * 2)
        return cache.sum(0)

    compiled = kiln.compile(f, options=CPP)
    base = torch.zeros(6 * 8 + 1, device=device)
    cache = base[1:].view(6, 8)
    expect = cache.clone()
    assert cache.data_ptr() % 16
    with Wrappers() as w, torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(1, 8, device=device), torch.tensor([step], device=device)
            torch.testing.assert_close(compiled(cache, x, pos), f(expect, x, pos))
            torch.testing.assert_close(cache, expect)
    assert w.graphs == [True], w.graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_symbolic_llama_bf16_on_cuda_serves_every_size() -> None:
    """On the GPU: one symbolic C++ library (Triton cubins compiled unspecialised) serves a bf16 HF Llama at
    every batch and sequence length; an MLP with an output view at a symbolic offset, and a SymInt input."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    mlp = MLP().cuda().eval()

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return (x[:, :n] * 2 + torch.arange(n, device=x.device)).cumsum(0)

    compiled, python = kiln.compile(model, options=CPP), kiln.compile(model)
    compiled_mlp, compiled_f = kiln.compile(mlp, options=CPP), kiln.compile(f, options=CPP)
    sizes = [*SIZES, (7, 300), (1, 511), (6, 128)]
    with Wrappers() as w, torch.no_grad():
        for b, t in sizes:
            ids = torch.randint(0, 512, (b, t), device="cuda")
            got = compiled(input_ids=ids, use_cache=False).logits
            want = model(input_ids=ids, use_cache=False).logits
            scale = want.float().abs().max().item()
            torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2 * max(scale, 1.0))
            torch.testing.assert_close(got, python(input_ids=ids, use_cache=False).logits)
    assert w.graphs == COMPILES, w.graphs
    with Wrappers() as w, torch.no_grad():
        for b, t in sizes:
            x = torch.randn(b, t, 24, device="cuda")
            torch.testing.assert_close(compiled_mlp(x), mlp(x))
            y, n = torch.randn(b, 16, device="cuda"), 2 + t % 14
            torch.testing.assert_close(compiled_f(y, n), f(y, n))
    assert all(w.graphs) and len(w.graphs) <= 6, w.graphs  # each: static, symbolic, batch 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpt2_like_peak_memory_is_the_python_wrappers() -> None:
    """A GPT-2-shaped model with GPT-2's 50257-wide head, bf16: the library allocates the logits when the
    head computes them (no output is live through the forward, none held twice), so the call's peak GPU
    memory is the Python wrapper's, not one logits tensor more."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=256, n_embd=256, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(config).to("cuda", torch.bfloat16).eval()
    compiled, python = kiln.compile(model, options=CPP), kiln.compile(model)

    def peak(fn: Any, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        logits = fn(input_ids=ids, use_cache=False).logits
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, logits

    with Wrappers() as w, torch.no_grad():
        for _ in range(3):  # fresh inputs; the first call compiles
            ids = torch.randint(0, 50257, (8, 256), device="cuda")
            (cpp, got), (py, ref) = peak(compiled, ids), peak(python, ids)
            want = model(input_ids=ids, use_cache=False).logits
            scale = want.float().abs().max().item()
            torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2 * max(scale, 1.0))
            del got, ref, want
    assert True in w.graphs and False in w.graphs, w.graphs  # each wrapper compiled its graph
    logits = 8 * 256 * 50257 * 2
    assert cpp <= 1.05 * py, f"peak MiB: C++ wrapper {cpp / 2**20:.0f}, Python wrapper {py / 2**20:.0f}"
    assert cpp < py + logits / 2, (cpp, py)


def test_updates_in_place_pass_bare_pointers(stage_texts) -> None:
    """An optimizer-style step (in-place updates of many tensors by grouped kernels): the C++ wrapper hands the
    kernels the inputs' data pointers, with no at::Tensor per input (an Adam step over 32 tensors wrapped all 160,
    twice the Python wrapper's host time), and the updates land in the caller's tensors on every call."""
    torch.manual_seed(0)
    params = [torch.randn(16) for _ in range(12)]
    moments = [torch.zeros(16) for _ in range(12)]

    def step(params: list[torch.Tensor], moments: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        torch._foreach_mul_(moments, 0.9)
        torch._foreach_add_(moments, grads, alpha=0.1)
        torch._foreach_add_(params, moments, alpha=-0.01)

    ref_params, ref_moments = [p.clone() for p in params], [m.clone() for m in moments]
    compiled = kiln.compile(step, options=CPP)
    with stage_texts("cpp_wrapper") as texts, Wrappers() as w, torch.no_grad():
        for _ in range(3):
            grads = [torch.randn(16) for _ in range(12)]
            compiled(params, moments, grads)
            step(ref_params, ref_moments, grads)
            torch.testing.assert_close(params, ref_params)
            torch.testing.assert_close(moments, ref_moments)
    assert w.graphs == [True] and len(texts) == 1
    body = texts[0].text.split("static void run_graph", 1)[1].split("KILN_EXPORT", 1)[0]
    assert "kiln_rt::wrap(" not in body, body[:2000]
    assert body.count("void* const arg") == 36


def test_kiln_graph_attention_runs_as_the_aten_composite() -> None:
    """kiln_graph::attention (symbolic masked attention whose kernel eager picks per call: HF decode steps on
    CUDA) is a torch.library op the C++ wrapper cannot call; it runs there as the ATen composite its kernel
    is, so such graphs get the C++ wrapper too, with eager's results over changing sizes."""
    import kiln.graph  # noqa: F401 - registers kiln_graph's ops

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = torch.ops.kiln_graph.attention.default(q, k, v, mask, False, 0.2, False)
        return out.transpose(1, 2).flatten(2) * 2

    def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2)
        return out.transpose(1, 2).flatten(2) * 2

    compiled = kiln.compile(attend, dynamic=True, options=CPP)
    with Wrappers() as w, torch.no_grad():
        for b, length, keys in ((2, 1, 9), (3, 1, 17), (2, 4, 12)):
            q = torch.randn(b, 4, length, 8)
            k, v = torch.randn(b, 4, keys, 8), torch.randn(b, 4, keys, 8)
            mask = torch.rand(b, 1, length, keys) > 0.3
            mask[..., 0] = True
            torch.testing.assert_close(compiled(q, k, v, mask), eager(q, k, v, mask))
    assert w.graphs and all(w.graphs), w.graphs
