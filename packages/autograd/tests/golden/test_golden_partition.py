"""Golden tests of the partitioner: each file under golden/partition/ holds a joint forward+backward graph
(as traced from the program below) and the forward and backward graphs the partitioner makes of it —
what is saved, what is recomputed. ``--update-golden`` rewrites the expected parts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from kiln.autograd import partition, trace_joint
from kiln.graph import check_golden

HERE = Path(__file__).parent / "partition"

PROGRAMS = {
    "pointwise_chain": lambda x, w: (torch.sin(torch.cos(x * w)).exp().sum(),),
    "mlp": lambda x, w: ((torch.relu(x @ w) @ w).sum(),),
    "gelu_mlp": lambda x, w: (F.gelu(x @ w).tanh().sum(),),
    "layer_norm": lambda x, w: (F.layer_norm(x @ w, (16,)).sigmoid().sum(),),
    "softmax": lambda x, w: (torch.softmax(x @ w, -1).log().sum(),),
    "residual": lambda x, w: ((x + torch.relu(x @ w)).pow(2).mean(),),
    "where": lambda x, w: (torch.where(x > 0, x * w, w).sum(),),
}
CASES = [(name, "min_cut") for name in PROGRAMS] + [("mlp", "save_all"), ("softmax", "save_all")]


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g).requires_grad_()]


@pytest.mark.parametrize(("name", "partitioner"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_golden_partition(name: str, partitioner: str, request) -> None:
    joint = trace_joint(fx.symbolic_trace(PROGRAMS[name]), _inputs())
    # the stored input must equal the joint graph traced now (so the file shows what was partitioned)
    check_golden(HERE / f"{name}-{partitioner}.txt", lambda _: partition(joint, partitioner).as_text(),
                 describe=f"partition(joint, {partitioner!r}) of {name} (x: [16, 16], w: [16, 16] requiring grad)",
                 update=request.config.getoption("--update-golden"), input=joint.as_text())


def test_every_golden_file_is_a_listed_case() -> None:
    listed = {f"{n}-{p}" for n, p in CASES}
    assert {p.stem for p in HERE.glob("*.txt")} <= listed
