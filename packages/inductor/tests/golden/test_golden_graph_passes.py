"""Golden tests of inductor's graph rewrites before lowering: each file under golden/graph_passes/ holds the
core ATen graph as traced from the program below (checked against the trace) and the graph the rewrite
makes of it. The rewrites are asked to act on CPU graphs here (their ``devices`` argument) so the files
show them without a GPU. ``--update-golden`` rewrites the expected parts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from golden_programs import CASES as PROGRAMS
from tracer import trace

from kiln.graph import check_golden, print_graph, target_name
from kiln.inductor import InductorOptions, decomp_bridge
from kiln.inductor.graph_passes.conv_layout import output_strides, to_channels_last
from kiln.inductor.graph_passes.gemv_as_reduction import rewrite_gemv
from kiln.inductor.graph_passes.pad_matmuls import pad_misaligned_matmuls
from kiln.inductor.graph_passes.stems import rewrite_patch_convs
from kiln.inductor.graph_passes.verify import verify_graph
from kiln.inductor.lowering.lower import lower_graph
from kiln.inductor.lowering.registry import LOWERINGS

HERE = Path(__file__).parent / "graph_passes"


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _gemv(gm: Any, inputs: list) -> str:
    return f"# {rewrite_gemv(gm)} matmul(s) rewritten"


def _pad_matmuls(gm: Any, inputs: list) -> str:
    return f"# {pad_misaligned_matmuls(gm, devices=('cpu',), min_macs=1, min_dim=1)} matmul(s) padded"


def _stems(gm: Any, inputs: list) -> str:
    return f"# {rewrite_patch_convs(gm, devices=('cpu',))} convolution(s) rewritten"


def _conv_layout(gm: Any, inputs: list) -> str:
    return f"# {to_channels_last(gm, inputs, output_strides(gm))} operand(s) made channels-last"


# case -> (what the rewrite is, the program, its inputs, the rewrite: (gm, inputs) -> a summary line)
CASES: dict[str, tuple[str, Callable[..., Any], tuple[torch.Tensor, ...], Callable[..., Any]]] = {
    "gemv_as_reduction-one_row_linear": ("gemv_as_reduction.rewrite_gemv: a one-row matmul as a fused multiply-reduce",
                                         lambda x, w, b: F.linear(x, w, b).relu(), (_r(1, 64), _r(32, 64), _r(32)),
                                         _gemv),
    "pad_matmuls-misaligned": ("pad_matmuls.pad_misaligned_matmuls: a matmul with a misaligned size on zero-padded operands",
                               lambda a, b: a @ b, (_r(30, 70), _r(70, 50)), _pad_matmuls),
    "stems-patch_embedding": ("stems.rewrite_patch_convs: a patch-embedding convolution as patches @ weight.T",
                              lambda x, w, b: F.conv2d(x, w, b, stride=4), (_r(2, 3, 16, 16), _r(8, 3, 4, 4), _r(8)),
                              _stems),
    "conv_layout-conv_relu": ("conv_layout.to_channels_last: convolution operands channels-last, outputs as traced",
                              lambda x, w: F.conv2d(x, w, padding=1).relu(), (_r(2, 8, 6, 6), _r(8, 8, 3, 3)),
                              _conv_layout),
}


def _graph(name: str) -> tuple[Any, list]:
    _, fn, inputs, _ = CASES[name]
    torch.manual_seed(0)
    gm = trace(fn, *inputs)
    decomp_bridge.ensure_meta(gm, list(inputs))
    gm = decomp_bridge.decompose(gm, list(inputs))
    return gm, list(inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_golden_graph_pass(name: str, request) -> None:
    describe, _, _, rewrite = CASES[name]
    gm, inputs = _graph(name)

    before = gm(*inputs)

    def run(_: str) -> str:
        summary = rewrite(gm, inputs)
        decomp_bridge.ensure_meta(gm, inputs)
        return f"{summary}\n{print_graph(gm)}"
    unlowered = _unlowered(gm)
    check_golden(HERE / f"{name}.txt", run, describe=describe, update=request.config.getoption("--update-golden"),
                 input=print_graph(gm))
    torch.testing.assert_close(gm(*inputs), before)  # the rewritten graph computes what the traced one did
    verify_graph(gm)  # the graph level's contract (KILN_VERIFY checks it after every graph pass)
    assert _unlowered(gm) <= unlowered, "the rewrite made ops lowering runs only as ATen fallbacks"


def _unlowered(gm: Any) -> set[str]:
    """The operators of ``gm`` that lowering has no rule for (they would run as ATen fallbacks)."""
    return {target_name(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and target_name(n.target) not in LOWERINGS}


LOWERED = ("pointwise", "broadcast_where", "softmax", "layer_norm", "sum_max_argmax", "transpose_reshape",
           "split_merge_dims", "cumsum", "embedding", "index_add", "cat_pad", "int_and_casts", "matmul_epilogue",
           "dropout", "bool_logic", "max_pool")


@pytest.mark.parametrize("name", LOWERED)
def test_golden_lowering(name: str, request) -> None:
    """lowering.lower_graph: a core ATen graph (as decomposed for inductor) to the loop program."""
    fn, inputs = PROGRAMS[name]
    torch.manual_seed(0)
    gm = trace(fn, *inputs)
    decomp_bridge.ensure_meta(gm, list(inputs))
    gm = decomp_bridge.decompose(gm, list(inputs))

    def run(_: str) -> str:
        program, fallbacks = lower_graph(gm, list(inputs), InductorOptions(strict_lowering=True), name)
        return "\n".join([*(f"# {f}" for f in fallbacks), program.as_text()])
    check_golden(HERE.parent / "lowering" / f"{name}.txt", run, update=request.config.getoption("--update-golden"),
                 describe="lowering.lower_graph: core ATen graph -> loop program", input=print_graph(gm))


DECOMPOSED = ("softmax", "layer_norm", "linear_gelu", "cat_pad", "max_pool", "index_add")


@pytest.mark.parametrize("name", DECOMPOSED)
def test_golden_decomposition(name: str, request) -> None:
    """decomp_bridge.decompose: the ATen graph to core ATen with kiln.decomp's "inductor" table."""
    fn, inputs = PROGRAMS[name]
    torch.manual_seed(0)
    gm = trace(fn, *inputs)
    decomp_bridge.ensure_meta(gm, list(inputs))
    before = gm(*inputs)
    out: list[Any] = []

    def run(_: str) -> str:
        out.append(decomp_bridge.decompose(gm, list(inputs)))
        return print_graph(out[0])
    check_golden(HERE.parent / "decompose" / f"{name}.txt", run, update=request.config.getoption("--update-golden"),
                 describe='decomp_bridge.decompose: ATen -> core ATen (kiln.decomp\'s "inductor" table)',
                 input=print_graph(gm))
    torch.testing.assert_close(out[0](*inputs), before)  # the decomposed graph computes what the traced one did


def test_every_golden_file_is_a_listed_case() -> None:
    assert {p.stem for p in HERE.glob("*.txt")} <= set(CASES)
    assert {p.stem for p in (HERE.parent / "lowering").glob("*.txt")} <= set(LOWERED)
    assert {p.stem for p in (HERE.parent / "decompose").glob("*.txt")} <= set(DECOMPOSED)
