"""Partitioning: min-cut saves no more than save-all, recomputes cheap ops only, never matmuls."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from ag_util import check, compile_fn  # type: ignore[import-not-found]
from torch import fx

from kiln.autograd import ops, partition, trace_joint
from kiln.graph import set_logs, verify

aten = torch.ops.aten
HEAVY = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
         aten._scaled_dot_product_flash_attention_for_cpu.default}

PROGRAMS = {
    "pointwise_chain": lambda x, w: (torch.sin(torch.cos(x * w)).exp().sum(),),
    "mlp": lambda x, w: ((torch.relu(x @ w) @ w).sum(),),
    "gelu_mlp": lambda x, w: (F.gelu(x @ w).tanh().sum(),),
    "layer_norm": lambda x, w: (F.layer_norm(x @ w, (16,)).sigmoid().sum(),),
    "softmax": lambda x, w: (torch.softmax(x @ w, -1).log().sum(),),
    "residual": lambda x, w: ((x + torch.relu(x @ w)).pow(2).mean(),),
    "cast_chain": lambda x, w: ((x.double() * w.double()).float().sum(),),
    "views": lambda x, w: ((x.t() @ w).view(-1).relu().sum(),),
    "two_matmuls_shared": lambda x, w: ((x @ w).sum() + ((x @ w) * 2).relu().sum(),),
    "reductions": lambda x, w: ((x * w).sum(0).softmax(0).sum() + (x * w).amax(),),
    "where": lambda x, w: (torch.where(x > 0, x * w, w).sum(),),
    "attention": lambda x, w: (F.scaled_dot_product_attention(
        (x @ w).view(1, 4, 8, 8), x.view(1, 4, 8, 8), w.view(1, 4, 8, 8)).sum(),),
}


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g).requires_grad_()]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_min_cut_saves_no_more_than_save_all(name: str) -> None:
    joint = trace_joint(fx.symbolic_trace(PROGRAMS[name]), _inputs())
    mc, sa = partition(joint, "min_cut"), partition(joint, "save_all")
    assert mc.saved_bytes <= sa.saved_bytes
    for p in (mc, sa):
        verify(p.fw_gm, "aten")
        verify(p.bw_gm, "aten")


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("partitioner", ["min_cut", "save_all"])
def test_partitioned_gradients_match_eager(name: str, partitioner: str) -> None:
    check(PROGRAMS[name], _inputs(), partitioner=partitioner)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_backward_recomputes_only_cheap_ops(name: str) -> None:
    joint = trace_joint(fx.symbolic_trace(PROGRAMS[name]), _inputs())
    mc = partition(joint, "min_cut")
    fw_targets = {n.target for n in mc.fw_gm.graph.nodes if n.op == "call_function"}
    joint_bw_only = _backward_only_targets(joint)
    for n in mc.bw_gm.graph.nodes:
        if n.op != "call_function" or n.target in joint_bw_only:
            continue
        if n.target in fw_targets and n.target in HEAVY:
            raise AssertionError(f"backward recomputes {n.target}")


def _backward_only_targets(joint) -> set:  # type: ignore[no-untyped-def]
    sa = partition(joint, "save_all")
    return {n.target for n in sa.bw_gm.graph.nodes if n.op == "call_function"}


def test_pointwise_chain_recomputed_instead_of_saved() -> None:
    f = PROGRAMS["pointwise_chain"]
    joint = trace_joint(fx.symbolic_trace(f), _inputs())
    mc, sa = partition(joint, "min_cut"), partition(joint, "save_all")
    assert mc.saved_bytes < sa.saved_bytes, (mc.saved, sa.saved)
    assert mc.n_saved <= 2  # the inputs: everything else is cheap to recompute


def test_matmul_output_saved_not_recomputed() -> None:
    joint = trace_joint(fx.symbolic_trace(PROGRAMS["mlp"]), _inputs())
    mc = partition(joint, "min_cut")
    fw_mm = sum(1 for n in mc.fw_gm.graph.nodes if n.target is aten.mm.default)
    assert fw_mm == 2
    # the backward has exactly the gradient matmuls (x needs no grad: 3), none recomputed
    bw_mm = sum(1 for n in mc.bw_gm.graph.nodes if n.target is aten.mm.default)
    assert bw_mm == 3


def test_partition_text_and_signature() -> None:
    joint = trace_joint(fx.symbolic_trace(PROGRAMS["mlp"]), _inputs())
    p = partition(joint)
    text = p.as_text()
    assert "---- forward ----" in text and "---- backward ----" in text and "saved" in text
    assert joint.as_text().startswith("# joint")
    with pytest.raises(ValueError, match="unknown partitioner"):
        partition(joint, "bogus")  # type: ignore[arg-type]


def test_aot_graphs_log_reports_saved_bytes(caplog: pytest.LogCaptureFixture) -> None:
    set_logs("aot_graphs")
    logger = logging.getLogger("kiln.aot_graphs")
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="kiln.aot_graphs"):
            compile_fn(PROGRAMS["mlp"], _inputs())
    finally:
        set_logs()
        logger.propagate = False
    text = caplog.text
    assert "saved_bytes=" in text and "---- forward ----" in text and "aten.mm.default" in text


def test_is_recomputable_classes() -> None:
    assert ops.is_recomputable(aten.add.Tensor)
    assert ops.is_recomputable(aten.view.default)
    assert ops.is_recomputable(aten._to_copy.default)
    assert not ops.is_recomputable(aten.mm.default)
    assert not ops.is_recomputable(aten.convolution.default)
    assert not ops.is_recomputable(aten.native_dropout.default)
    assert not ops.is_recomputable(aten.bernoulli.p)
    assert not ops.is_recomputable(aten.sum.dim_IntList)


def _eager_saved_bytes(fn, inputs) -> int:  # type: ignore[no-untyped-def]
    seen: dict[tuple[int, tuple[int, ...]], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[(t.untyped_storage().data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


@pytest.mark.parametrize("name", ["pointwise_chain", "mlp", "gelu_mlp", "layer_norm", "softmax", "residual"])
def test_min_cut_saves_no_more_than_eager(name: str) -> None:
    inputs = _inputs()
    joint = trace_joint(fx.symbolic_trace(PROGRAMS[name]), inputs)
    assert partition(joint, "min_cut").saved_bytes <= _eager_saved_bytes(PROGRAMS[name], inputs)
