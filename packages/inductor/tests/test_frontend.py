"""kiln.inductor behind torch.compile(backend=...) on its own (torch-level graphs traced to ATen here)."""

from __future__ import annotations

import torch

from kiln.inductor import inductor_backend


def test_torch_compile_function_with_inplace_op() -> None:
    def f(x, w):
        y = torch.nn.functional.layer_norm(x, (16,), w)
        y += 1  # in-place on an intermediate: recorded as its functional form
        return torch.relu(y) * 2, y.sum()
    x, w = torch.randn(4, 16), torch.randn(16)
    cf = torch.compile(f, backend=inductor_backend)
    a, b = cf(x, w)
    ra, rb = f(x, w)
    torch.testing.assert_close(a, ra)
    torch.testing.assert_close(b, rb, atol=1e-4, rtol=1e-4)


def test_torch_compile_module_inference() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(4, 16)
    cm = torch.compile(m, backend=inductor_backend)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))


def test_a_graph_writing_its_input_runs_uncompiled_and_correct(caplog) -> None:
    """kiln.decomp's recorder refuses to functionalize a write to an input: the graph runs as is
    (said in perf_hints), and every call gives eager's result and eager's side effect."""
    import logging

    from torch import fx

    from kiln.inductor import inductor_backend as backend

    def f(x, y):
        x.add_(1)
        return x * y

    gm = fx.symbolic_trace(f)
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"):
        run = backend(gm, [torch.randn(5), torch.randn(5)])
    assert any("uncompiled" in r.getMessage() for r in caplog.records)
    for _ in range(3):
        x, y = torch.randn(5), torch.randn(5)
        xe = x.clone()
        torch.testing.assert_close(run(x, y), f(xe, y))
        torch.testing.assert_close(x, xe)


def test_a_scalar_input_keeps_its_placeholder() -> None:
    """The ATen graph takes the same argument list as the torch graph (an int included)."""
    from torch import fx

    from kiln.inductor import inductor_backend as backend
    from kiln.inductor import to_aten

    gm2 = fx.symbolic_trace(lambda x, n: (x * 3 + 1).relu())
    aten = to_aten(gm2, [torch.randn(4), 3])
    assert len([n for n in aten.graph.nodes if n.op == "placeholder"]) == 2
    run = backend(gm2, [torch.randn(4), 3])
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(run(x, 3), (x * 3 + 1).relu())
