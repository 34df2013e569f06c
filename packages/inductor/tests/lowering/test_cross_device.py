"""A graph whose inputs are on the CPU but whose work runs on the GPU (``x.cuda()`` in the program,
NumPy under ``with torch.device("cuda")``) compiles to Triton kernels, and its CPU-side nodes run
through ATen: no generated kernel reads or writes memory of the other device. Before, the backend was
chosen from the inputs alone, so such a graph got C++ kernels handed CUDA pointers (a segfault on the
H200). Traced on fake CUDA tensors, which a CUDA build of torch makes without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode  # tests only: fake CUDA without a GPU

from kiln.decomp import trace
from kiln.inductor import InductorOptions
from kiln.inductor.codegen.triton.backend import TritonBackend
from kiln.inductor.ir import ComputedBuffer, ExternKernel
from kiln.inductor.lowering.lower import lower_graph
from kiln.inductor.pipeline import choose_backend

OPTIONS = InductorOptions()


def moves_to_the_gpu(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cpu_side = (x * 3.0).sum(0)  # CPU work before the move
    y = x.to("cuda") * 2.0 + s  # s: a 0-dim CPU tensor beside CUDA tensors, as eager allows
    return y.relu().to("cpu"), cpu_side


def _graph():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            x, s = torch.empty(4, 8), torch.empty(())
    except (RuntimeError, AssertionError) as e:  # a CPU-only build of torch has no fake CUDA
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    try:
        gm = trace(moves_to_the_gpu, [x, s], functionalize=True)
    except (RuntimeError, AssertionError) as e:
        pytest.skip(f"fake CUDA tensors need a CUDA build of torch: {e}")
    return gm, [x, s]


def test_a_graph_that_computes_on_the_gpu_gets_triton_kernels() -> None:
    gm, inputs = _graph()
    assert all(t.device.type == "cpu" for t in inputs)
    backend = choose_backend(inputs, OPTIONS, gm)
    assert isinstance(backend, TritonBackend) and backend.device == "cuda"
    assert not isinstance(choose_backend(inputs, OPTIONS), TritonBackend)  # the inputs alone say CPU


def test_nodes_on_the_other_device_run_through_aten() -> None:
    gm, inputs = _graph()
    program, fallbacks = lower_graph(gm, inputs, OPTIONS, "graph", "cuda")
    externs = [n for n in program.nodes if isinstance(n, ExternKernel)]
    computed = [n for n in program.nodes if isinstance(n, ComputedBuffer)]
    on_cpu = {n.target for n in externs if any(o.layout.device == "cpu" for o in n.outputs)}
    # the CPU-side mul/sum and the copies out and in are ATen calls; the GPU-side work is generated code
    assert {"aten._to_copy.default", "aten.sum.dim_IntList"} <= {n.target for n in externs}, externs
    assert "aten.sum.dim_IntList" in on_cpu
    assert computed, "the CUDA-side mul/add/relu must still be generated kernels"
    assert any("reads or makes a cpu tensor" in f for f in fallbacks), fallbacks
