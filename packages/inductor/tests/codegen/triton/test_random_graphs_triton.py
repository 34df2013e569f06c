"""The hypothesis random graphs of tests/test_random_graphs.py, through the Triton path.

Cases per run = examples x CHAINS; KILN_TRITON_HYPOTHESIS_EXAMPLES (default 2 -> 40 cases on the
interpreter; CI may raise it, e.g. 100 -> 2,000 cases).
"""

from __future__ import annotations

import os

import test_random_graphs as base
import torch
from helpers import check
from hypothesis import HealthCheck, given, settings

from kiln.inductor import InductorOptions
from kiln.inductor.codegen.triton.testing import device

EXAMPLES = int(os.environ.get("KILN_TRITON_HYPOTHESIS_EXAMPLES", "2"))
OPTIONS = InductorOptions(cpu_backend="triton")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(base.program())
def test_random_graph_matches_eager_on_triton(prog) -> None:
    shape, chains, transposed = prog
    torch.manual_seed(0)
    dev = device()
    a = torch.randn(shape, device=dev)
    b = (torch.randn(shape[::-1], device=dev).permute(*range(len(shape) - 1, -1, -1)) if transposed
         else torch.randn(shape, device=dev))

    def f(a, b):
        return tuple(base.run_chain(c, a, b) for c in chains)
    check(f, a, b, atol=1e-4, rtol=1e-3, options=OPTIONS)
