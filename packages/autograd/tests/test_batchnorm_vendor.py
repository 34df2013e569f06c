"""CUDA batch norm without a GPU: cuDNN's/MIOpen's batch-norm kernels (what ``batch_norm`` dispatches to
on CUDA/ROCm) are traced as the native ops, whose functional forms and backward run anywhere. The
vendor ops are called explicitly on CPU tensors (their autograd formulas are device-independent), and
the CUDA dispatch itself is traced on fake CUDA tensors (forward only: the autograd engine needs a
real device to run a backward). The training run on a GPU is tests/test_gpu.py."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from ag_util import compile_fn  # type: ignore[import-not-found]
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from kiln.autograd import trace_inference

aten = torch.ops.aten


def vendor_graph(op: torch._ops.OpOverload, training: bool) -> fx.GraphModule:
    g = fx.Graph()
    x, w, b, rm, rv = (g.placeholder(n) for n in ("x", "w", "b", "rm", "rv"))
    bn = g.call_function(op, (x, w, b, rm, rv, training, 0.1, 1e-5))
    y = g.call_function(operator.getitem, (bn, 0))
    g.output((g.call_function(aten.relu.default, (y,)),))
    return fx.GraphModule(nn.Module(), g)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(4, 3, 5, 5, requires_grad=True), torch.rand(3, requires_grad=True),
            torch.randn(3, requires_grad=True), torch.randn(3), torch.rand(3) + 0.5]


def _clone(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]


@pytest.mark.parametrize("op", [aten.cudnn_batch_norm.default, aten.miopen_batch_norm.default],
                         ids=["cudnn", "miopen"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_vendor_batch_norm_matches_native(op: torch._ops.OpOverload, training: bool) -> None:
    inputs = _inputs()
    compiled = compile_fn(vendor_graph(op, training), _clone(inputs))
    text = compiled.texts["aot_forward"] + compiled.texts["aot_backward"]
    assert "cudnn" not in text and "miopen" not in text, text
    c_stats, e_stats = _clone(inputs[3:]), _clone(inputs[3:])
    for _ in range(2):  # running stats carry over between calls
        c_in, e_in = _clone(inputs[:3]) + c_stats, _clone(inputs[:3]) + e_stats
        (out,) = compiled(*c_in)
        ref = F.batch_norm(e_in[0], e_in[3], e_in[4], e_in[1], e_in[2], training, 0.1, 1e-5).relu()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        for i in range(3):
            torch.testing.assert_close(c_in[i].grad, e_in[i].grad, rtol=1e-4, atol=1e-5, msg=f"grad {i}")
        torch.testing.assert_close(c_in[3], e_in[3], msg="running_mean")
        torch.testing.assert_close(c_in[4], e_in[4], msg="running_var")
        if training:
            assert not torch.equal(c_in[3], inputs[3]), "running_mean was not updated"
        c_stats, e_stats = c_in[3:], e_in[3:]


def _fake_cuda_bn() -> tuple[fx.GraphModule, torch.Tensor]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode, torch.device("cuda"):
            model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).train()
            x = torch.empty(4, 3, 8, 8)
    except (RuntimeError, AssertionError) as e:  # a torch build without CUDA support
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    return fx.symbolic_trace(model), x


@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn_on", "cudnn_off"])
def test_cuda_batch_norm_traces_native_functional(cudnn: bool) -> None:
    gm, x = _fake_cuda_bn()
    with torch.backends.cudnn.flags(enabled=cudnn):
        graph = trace_inference(gm, [x])
    text = graph.as_text()
    assert "cuda:0" in text
    assert "_native_batch_norm_legit_functional" in text and "cudnn" not in text, text
    names = graph.signature.input_names
    assert {names[i] for i in graph.signature.mutated_inputs} == \
        {"1.running_mean", "1.running_var", "1.num_batches_tracked"}


def test_explicit_cudnn_batch_norm_on_fake_cuda() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode, torch.device("cuda"):
            inputs = [torch.empty(4, 3, 5, 5), torch.empty(3), torch.empty(3), torch.empty(3),
                      torch.empty(3)]
    except (RuntimeError, AssertionError) as e:
        pytest.skip(f"fake CUDA tensors unavailable: {e}")
    graph = trace_inference(vendor_graph(aten.cudnn_batch_norm.default, True), inputs)
    text = graph.as_text()
    assert "cudnn" not in text and "_native_batch_norm_legit_functional" in text
    assert graph.signature.mutated_inputs == (3, 4)


def test_training_batch_norm_backward_saves_no_running_stats() -> None:
    # the training-mode backward reads save_mean/save_invstd only; the updated running stats (new
    # tensors after functionalization) must not be kept for it (eager keeps none either)
    gm = fx.symbolic_trace(nn.Sequential(nn.BatchNorm1d(4), nn.Tanh()).train())
    compiled = compile_fn(gm, [torch.randn(8, 4, requires_grad=True)])
    parts = compiled.aot.partitioned
    (bwd,) = [n for n in parts.bw_gm.graph.nodes if n.target is aten.native_batch_norm_backward.default]
    assert bwd.args[3] is None and bwd.args[4] is None
    vectors = [p for p in parts.bw_gm.graph.nodes
               if p.op == "placeholder" and p.name.startswith("saved_") and tuple(p.meta["val"].shape) == (4,)
               and "primals" not in p.name]
    assert len(vectors) == 2, [p.name for p in vectors]  # save_mean and save_invstd
