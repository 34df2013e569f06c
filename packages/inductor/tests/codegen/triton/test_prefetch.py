"""Weights prefetched into L2 ahead of the PDL wait (codegen/triton/prefetch.py): one-row matmuls' kernels
fetch the rows of the weights they read in full before they wait for the kernel before them, and let the
next kernel launch only after that wait; reads of what the graph writes, reads under a ``where`` branch
and the option off prefetch nothing. The sm_90 machine code keeps every load after the wait; on a GPU
the compiled chain equals eager over fresh inputs and weights updated in place between calls."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from codegen.triton.sm90 import cross_env, sass_ops, subprocess_paths

from kiln.inductor.codegen.triton.kernel import TritonKernel
from kiln.inductor.codegen.triton.pdl import AFTER_PREFETCH, PROLOGUE, with_pdl, without_pdl
from kiln.inductor.codegen.triton.prefetch import Stream

F = torch.nn.functional


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """A decode-style block at one row: norm weight, up projection, SiLU, down projection, residual."""
    return F.linear(F.silu(F.linear(x * n, w1)), w2) + x


def _written(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    w1.mul_(0.5)  # the graph writes w1 in place: its reads are not worth a prefetch
    return _mlp(x, w1, w2, n)


def _cat(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return F.linear(x, torch.cat([w1[:128], w2.t()[:128]]))  # each read under a where branch


# compiles the functions above for fake CUDA tensors with KILN_TRITON_CROSS_TARGET (the interpreter,
# which this folder runs, has no grid dependency control: kiln writes no PDL there)
PROGRAM = textwrap.dedent("""
    import json, sys, torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    sys.path[:0] = sys.argv[2:]
    from tracer import trace
    import test_prefetch as t
    from kiln.inductor import InductorOptions, compile_graph
    out = {}
    for fn, options in json.loads(sys.argv[1]):
        with FakeTensorMode(allow_non_fake_inputs=True):
            bf = dict(device="cuda", dtype=torch.bfloat16)
            args = [torch.empty(1, 256, **bf), torch.empty(512, 256, **bf), torch.empty(256, 512, **bf),
                    torch.empty(256, **bf)]
            graph = compile_graph(trace(getattr(t, fn), *args), args,
                                  options=InductorOptions(strict_lowering=True, **options))
        out[fn + json.dumps(options)] = graph.texts["output_code"]
    print(json.dumps(out))
""")


def _compile(cases: list[tuple[str, dict]]) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(cases), *subprocess_paths()], capture_output=True,
                       text=True, env=cross_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


ON = {"pdl_prefetch": True}


@pytest.fixture(scope="module")
def codes() -> dict[str, str]:
    return _compile([("_mlp", ON), ("_mlp", {}), ("_mlp", {"pdl_prefetch": True, "pdl": False}),
                     ("_written", ON), ("_cat", ON)])


def _functions(code: str) -> dict[str, str]:
    """The launched kernel functions' names -> their bodies (up to the next decorator)."""
    launched = set(re.findall(r"= _KilnLaunch\(triton_kernels\.(\w+),", code))
    parts = re.split(r"^@triton\.jit\n", code, flags=re.M)
    found = {m.group(1): p for p in parts if (m := re.match(r"def (\w+)\(", p)) and m.group(1) in launched}
    assert len(found) == len(launched) >= 2, (launched, found.keys())
    return found


def _prefetched(body: str) -> list[str]:
    return re.findall(r'"prefetch\.global\.L2 \[\$1\]; mov\.u32 \$0, 0;", "=r,l", \[(ptr_\w+) \+', body)


def test_each_one_row_matmul_prefetches_its_weight_then_waits(codes: dict[str, str]) -> None:
    fns = _functions(codes["_mlp" + json.dumps(ON)])
    got = {name: _prefetched(body) for name, body in fns.items()}
    assert sorted(p for ps in got.values() for p in ps) == ["ptr_arg1", "ptr_arg2"], got
    for name, body in fns.items():
        if got[name]:  # the prefetch lines, then the wait, then the early launch, then the kernel
            head = body.split("\n")[1:]
            n = sum(1 for line in head if line.endswith("# prefetch (pdl.py)"))
            assert n == 3 * len(got[name]) and "\n".join(head[n:n + 2]) + "\n" == AFTER_PREFETCH, body[:1500]
            assert "tl.load" not in "\n".join(head[:n + 2])
        else:
            assert body.split("\n", 1)[1].startswith(PROLOGUE), body[:600]


def test_off_by_default_and_without_pdl(codes: dict[str, str]) -> None:
    assert "prefetch.global" not in codes["_mlp{}"] and "gdc_wait" in codes["_mlp{}"]
    off = codes["_mlp" + json.dumps({"pdl_prefetch": True, "pdl": False})]
    assert "prefetch.global" not in off and "gdc_" not in off


def test_no_prefetch_of_what_the_graph_writes_or_of_a_branch(codes: dict[str, str]) -> None:
    written = {n: _prefetched(b) for n, b in _functions(codes["_written" + json.dumps(ON)]).items()}
    assert [p for ps in written.values() for p in ps] == ["ptr_arg2"], written
    cat = codes["_cat" + json.dumps(ON)]
    assert "gdc_wait" in cat and "prefetch.global" not in cat


def test_without_pdl_restores_the_kernel() -> None:
    src = ("@triton.jit\ndef k1(ptr_a, ptr_w, ptr_o, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):\n"
           "    xoffset = tl.program_id(0) * XBLOCK\n")
    k = TritonKernel(name="k1", source=src, pointer_args=("a", "w", "o"), size_args=(), xnumel="64", xblock=4,
                     rblock=128, num_warps=4, kind="persistent_reduction",
                     streams=(Stream("w", 128, 0, 64, 128, 2),))
    on = with_pdl(k)
    assert on.pdl and "ptr_w + (0 + 128 * pf_x0 + pf_r0)" in on.source and AFTER_PREFETCH in on.source
    assert without_pdl(on) == k
    # a program's rows x lines beyond the cap: no prefetch, the plain prologue
    wide = TritonKernel(name="k1", source=src, pointer_args=("a", "w", "o"), size_args=(), xnumel="64",
                        xblock=512, rblock=128, num_warps=4, kind="persistent_reduction",
                        streams=(Stream("w", 1 << 16, 0, 64, 1 << 16, 2),))
    assert PROLOGUE in with_pdl(wide).source and without_pdl(with_pdl(wide)) == wide


@pytest.mark.slow
def test_machine_code_prefetches_before_the_wait_and_loads_after(tmp_path) -> None:
    """sm_90 SASS (triton's ptxas): the prefetches (CCTL) come before the grid dependency wait (ACQBULK),
    every global load and store after it, and the early launch (PREEXIT) after it too."""
    bf16 = "bfloat16"
    kernels = sass_ops(tmp_path, "test_prefetch", "_mlp", [([1, 256], bf16), ([512, 256], bf16), ([256, 512], bf16),
                                                           ([256], bf16)], ON)
    prefetching = [name for name, ops in kernels.items() if any(op.startswith("CCTL") for op in ops)]
    assert len(prefetching) == 2, kernels.keys()
    for name in prefetching:
        ops = kernels[name]
        memory = [i for i, op in enumerate(ops) if op.split(".")[0] in ("LDG", "STG", "ATOMG", "RED", "LD", "ST")]
        cctl = [i for i, op in enumerate(ops) if op.startswith("CCTL")]
        assert memory and max(cctl) < ops.index("ACQBULK") < min(memory), (name, ops[:60])
        assert ops.index("ACQBULK") < ops.index("PREEXIT"), (name, ops[:60])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90+ GPU")
@pytest.mark.parametrize(("mode", "wrapper"), [("reduce-overhead", None), ("default", "python"), ("default", "cpp")])
def test_prefetching_kernels_match_eager_as_weights_change(mode: str, wrapper: str | None) -> None:
    """A one-row MLP stack replayed in a CUDA graph and launched by each wrapper, its weights updated in place
    between calls (a prefetch never serves an old value) and fresh inputs each call."""
    import kiln

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.SiLU(), torch.nn.Linear(2048, 512),
                                torch.nn.SiLU(), torch.nn.Linear(512, 1024)).cuda().to(torch.bfloat16)
    options = {"pdl_prefetch": True, **({"wrapper": wrapper} if wrapper else {})}
    step = kiln.compile(lambda x: model(x), mode=mode, options=options)
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(step(x), model(x), rtol=2e-2, atol=2e-2)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
