"""Programmatic dependent launch (codegen/triton/pdl.py): every generated kernel of a CUDA graph waits for
the kernel before it ahead of any memory access, and its launcher sets the launch attribute; nothing
changes on the CPU, under the interpreter or with the option off. On a GPU, a chain of dependent kernels
(reductions reading what the kernel before wrote, buffers reused) replayed in a CUDA graph equals eager
over fresh inputs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from codegen.triton.sm90 import cross_env, sass_ops, subprocess_paths
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.kernel import TritonKernel
from kiln.inductor.codegen.triton.pdl import PROLOGUE, with_pdl

OPTS = InductorOptions(strict_lowering=True)
LAUNCHER = re.compile(r"^(_launch_\w+) = _KilnLaunch\(triton_kernels\.(\w+), (.*)\)$", re.M)


def _chain(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = torch.nn.functional.gelu(x @ w + b)  # a library matmul, then kernels reading its result
    s = torch.softmax(h, -1)
    n = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)
    return (n.sum(0), (n @ w.t()).relu() + x)


# compiles _chain for fake CUDA tensors in a process without the interpreter (this folder runs triton's
# interpreter on the CPU, where kiln writes no PDL: the interpreter has no grid dependency control)
PROGRAM = textwrap.dedent("""
    import json, sys, torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    sys.path[:0] = sys.argv[2:]
    from tracer import trace
    from test_pdl import OPTS, _chain
    from kiln.inductor import compile_graph
    codes = []
    for pdl in json.loads(sys.argv[1]):
        with FakeTensorMode(allow_non_fake_inputs=True):
            args = [torch.empty(64, 96, device="cuda"), torch.empty(96, 96, device="cuda"),
                    torch.empty(96, device="cuda")]
            graph = compile_graph(trace(_chain, *args), args, options=OPTS.replace(pdl=pdl))
        codes.append(graph.texts["output_code"])
    print(json.dumps(codes))
""")


def _compile_for(target: str, pdl: list[bool]) -> list[str]:
    """The wrapper of _chain compiled for CUDA ``target`` (its kernels compiled for it too), per option."""
    r = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(pdl), *subprocess_paths()], capture_output=True,
                       text=True, env=cross_env(target), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cuda_programs() -> tuple[str, str]:
    """The wrapper of _chain compiled for sm_90, with PDL and with ``pdl=False``."""
    on, off = _compile_for("cuda:90", [True, False])
    return on, off


def _launched(code: str) -> list[tuple[str, str, str]]:
    return LAUNCHER.findall(code)


def test_every_cuda_kernel_waits_for_the_previous_one_before_touching_memory(cuda_programs: tuple[str, str]) -> None:
    code, _ = cuda_programs
    launched = _launched(code)
    functions = {fn for _, fn, _ in launched}
    assert len(functions) >= 3, code
    for launcher, fn, args in launched:
        assert args.endswith("pdl=True"), (launcher, args)
        body = code.split(f"def {fn}(", 1)[1].split("\n")[1:3]
        assert "\n".join(body) + "\n" == PROLOGUE, (fn, body)
    # the kernel functions, and only they, start with it
    starting = set(re.findall(r"^def (\w+)\(.*\n" + re.escape(PROLOGUE), code, re.M))
    assert starting == functions, (starting, functions)


def test_off_by_option_and_on_the_cpu(cuda_programs: tuple[str, str]) -> None:
    _, off = cuda_programs
    assert _launched(off) and "gdc_" not in off and "pdl=True" not in off
    x = torch.randn(64, 96)
    w, b = torch.randn(96, 96), torch.randn(96)
    cg = compile_graph(trace(_chain, x, w, b), [x, w, b], options=OPTS.replace(cpu_backend="triton"))
    assert _launched(cg.texts["output_code"]) and "gdc_" not in cg.texts["output_code"]
    for got, want in zip(cg.fn(x, w, b), _chain(x, w, b)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_no_pdl_for_a_gpu_before_sm90() -> None:
    """ptxas refuses griddepcontrol for sm_80: kernels for such a target are written (and compile) without."""
    (older,) = _compile_for("cuda:80", [True])
    assert _launched(older) and "gdc_" not in older and "pdl=True" not in older


@pytest.mark.slow
def test_the_wait_precedes_every_memory_access_in_the_machine_code(tmp_path) -> None:
    """What the GPU runs: in each kernel's sm_90 SASS (triton's own ptxas and cuobjdump), the grid dependency
    wait (ACQBULK) comes before the first global load, store or atomic, and the early launch (PREEXIT) before it:
    no compiler pass moved a memory access above the wait."""
    f32 = "float32"
    kernels = sass_ops(tmp_path, "test_pdl", "_chain", [([64, 96], f32), ([96, 96], f32), ([96], f32)], {})
    assert len(kernels) >= 3
    for name, ops in kernels.items():
        memory = [i for i, op in enumerate(ops) if op.split(".")[0] in ("LDG", "STG", "ATOMG", "RED", "LD", "ST")]
        assert memory and "ACQBULK" in ops, (name, ops[:40])
        assert ops.index("PREEXIT") < ops.index("ACQBULK") < memory[0], (name, ops[:40])


def test_a_kernel_groups_helpers_and_a_shared_function_are_left_alone() -> None:
    part = "@triton.jit\ndef part0(ptr_a, pid):\n    tl.store(ptr_a + pid, 1.0)\n"
    group = ("@triton.jit\ndef group0(ptr_a,\n           ptr_b, XBLOCK: tl.constexpr):\n"
             "    pid = tl.program_id(0)\n    part0(ptr_a, pid)\n")
    k = TritonKernel(name="group0", source=part + "\n\n" + group, pointer_args=("a", "b"), size_args=(),
                     xnumel="8", xblock=1, rblock=0, num_warps=1, kind="pointwise_group")
    got = with_pdl(k)
    assert got.pdl and with_pdl(got) is got
    # after the whole (wrapped) signature of the group's function; the part's body unchanged
    assert got.source == part + "\n\n" + group.replace("tl.constexpr):\n", "tl.constexpr):\n" + PROLOGUE)
    shared = TritonKernel(name="k7", source="", pointer_args=("a",), size_args=(), xnumel="8", xblock=1,
                          rblock=0, num_warps=1, kind="pointwise", function="k3")
    assert with_pdl(shared).pdl and with_pdl(shared).source == ""
    assert with_pdl(shared).launcher_definition("m").endswith(", pdl=True)")
    with pytest.raises(ValueError, match="no line starting 'def k9\\('"):
        with_pdl(TritonKernel(name="k9", source=part, pointer_args=(), size_args=(), xnumel="1", xblock=1,
                              rblock=0, num_warps=1, kind="pointwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90+ GPU")
@pytest.mark.parametrize(("mode", "wrapper"), [("reduce-overhead", None), ("default", "python"), ("default", "cpp")])
def test_dependent_kernels_match_eager_over_fresh_inputs(mode: str, wrapper: str | None) -> None:
    """Replayed in a CUDA graph (programmatic edges between its kernel nodes) and launched one by one by
    each wrapper (the C++ one through cuLaunchKernelEx)."""
    import kiln

    model = torch.nn.Sequential(torch.nn.Linear(96, 384), torch.nn.GELU(), torch.nn.LayerNorm(384),
                                torch.nn.Linear(384, 96), torch.nn.Softmax(-1)).cuda()
    step = kiln.compile(lambda x: model(x).cumsum(-1) + x.mean(), mode=mode,
                        options={"wrapper": wrapper} if wrapper else None)
    with torch.no_grad():
        for i in range(12):
            x = torch.randn(33, 96, device="cuda") * (1 + i)
            torch.testing.assert_close(step(x), model(x).cumsum(-1) + x.mean(), rtol=1e-4, atol=1e-4)
