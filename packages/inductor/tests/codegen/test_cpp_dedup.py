"""Identical C++ kernels of one graph are built once (g++ time grows with the bodies it compiles):
each kernel calls the symbol of the first kernel with the same canonical source. Every result is
compared with eager, and kernels that differ in anything but buffer names are never merged."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import check, n_kernels

from kiln.inductor.codegen.cpp import canonical_source, unique_kernel_sources
from kiln.inductor.options import DEFAULT_OPTIONS


def _bodies(cg) -> list[str]:
    src = cg.texts["output_code"].split("# ---- kernels")[1]
    return ['extern "C"' + k for k in src.split('extern "C"')[1:]]


def _unique(cg) -> tuple[list[str], dict[str, str]]:
    kernels = cg.scheduled.kernels()
    return unique_kernel_sources(kernels, cg.loop_program.layouts(), DEFAULT_OPTIONS)


def test_repeated_layers_build_one_body_per_distinct_kernel() -> None:
    def f(x, *ws):
        for w, m in zip(ws[::2], ws[1::2]):  # four "layers" over different weights and buffers
            x = F.gelu(F.layer_norm(x @ m, (32,), w, None)) * 2.0  # the matmul splits the kernels
        return x

    ws = [t for _ in range(4) for t in (torch.randn(32), torch.randn(32, 32) / 6)]
    cg = check(f, torch.randn(8, 32), *ws, atol=1e-4)
    assert n_kernels(cg) >= 4
    bodies, symbol = _unique(cg)
    assert len(bodies) < n_kernels(cg)
    assert len(_bodies(cg)) == len(bodies)  # only the distinct bodies are compiled
    assert len(set(symbol.values())) == len(bodies)
    # merged kernels generate the same C++ up to buffer names (what the shared body computes)
    from kiln.inductor.codegen.cpp.kernel import kernel_source

    by_name = {k.name: k for k in cg.scheduled.kernels()}
    layouts = cg.loop_program.layouts()
    for name, sym in symbol.items():
        a, b = by_name[name], by_name[sym]
        assert canonical_source(a, kernel_source(a, layouts, DEFAULT_OPTIONS)) == \
            canonical_source(b, kernel_source(b, layouts, DEFAULT_OPTIONS))


def test_kernels_differing_in_a_constant_are_not_merged() -> None:
    def f(x, m):
        a = torch.softmax(x * 2.0, -1)
        b = torch.softmax((a @ m) * 3.0, -1)  # same structure, another constant
        return a, b

    cg = check(f, torch.randn(4, 64), torch.randn(64, 64))
    bodies, symbol = _unique(cg)
    assert len(bodies) == n_kernels(cg) == 2
    assert len(set(symbol.values())) == 2


def test_kernels_differing_in_argument_order_are_not_merged() -> None:
    def f(x, y, m):
        a = torch.softmax(x - y, -1)
        b = torch.softmax(y - (x @ m), -1)  # operands swapped
        return a, b

    cg = check(f, torch.randn(4, 64), torch.randn(4, 64), torch.eye(64))
    kernels = cg.scheduled.kernels()
    bodies, symbol = _unique(cg)
    assert len(kernels) == 2
    assert len(bodies) == 2 and symbol[kernels[0].name] != symbol[kernels[1].name]


def test_kernels_differing_only_in_buffers_are_merged() -> None:
    def f(x, y, m):
        a = torch.softmax(x - y, -1)
        b = torch.softmax((a @ m) - y, -1)  # the same kernel over another first operand
        return a, b

    cg = check(f, torch.randn(4, 64), torch.randn(4, 64), torch.randn(64, 64))
    kernels = cg.scheduled.kernels()
    bodies, symbol = _unique(cg)
    assert len(kernels) == 2 and len(bodies) == 1
    assert symbol[kernels[1].name] == kernels[0].name


def test_kernels_differing_in_shape_or_dtype_are_not_merged() -> None:
    def f(x, y, z):
        return torch.exp(x) + 1, torch.exp(y) + 1, torch.exp(z) + 1

    cg = check(f, torch.randn(16, 8), torch.randn(8, 16).t(), torch.randn(16, 8, dtype=torch.float64))
    bodies, _ = _unique(cg)
    assert len(bodies) == n_kernels(cg)


def test_canonical_source_renames_buffers_consistently() -> None:
    def f(x):
        return torch.relu(x) * 2 + 1, torch.relu(x + 1)

    cg = check(f, torch.randn(8, 8))
    for k in cg.scheduled.kernels():
        from kiln.inductor.codegen.cpp.kernel import kernel_source

        src = kernel_source(k, cg.loop_program.layouts(), DEFAULT_OPTIONS)
        canon = canonical_source(k, src)
        assert k.name not in canon
        for b in (*k.inputs, *k.outputs):
            assert f"p_{b}" not in canon
        assert canon == canonical_source(k, src)  # deterministic
