"""Identical layers' kernels share one Triton function (compiled once); results still match eager."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.dedup import normalized_source, share_identical_kernels
from kiln.inductor.codegen.triton.kernel import TritonKernel
from kiln.inductor.codegen.triton.testing import device

OPTIONS = InductorOptions(cpu_backend="triton")


def _layers(x, *ws):  # a matmul between layers keeps each layer's kernels apart
    for w in ws:
        x = x + F.gelu(F.layer_norm(x, x.shape[-1:]) @ w)
    return (x,)


def test_identical_layers_compile_one_function_each_and_match_eager():
    dev = device()
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(8, 32, generator=g).to(dev)] + [torch.randn(32, 32, generator=g).to(dev) * 0.2 for _ in range(5)]
    cg = compile_graph(trace(_layers, *args), args, options=OPTIONS)
    src = cg.texts["output_code"]
    functions = set(re.findall(r"^def (k\w+)\(", src, re.M))
    launchers = re.findall(r"^(_launch_k\w+) = _KilnLaunch\(triton_kernels\.(\w+),", src, re.M)
    assert len(launchers) >= 3 and len(functions) < len(launchers), (functions, launchers)
    assert {fn for _, fn in launchers} == set(functions)  # every launcher points at a defined function
    torch.testing.assert_close(cg.fn(*args)[0], _layers(*args)[0], rtol=1e-4, atol=1e-5)


def _kernel(name: str, ptrs: tuple[str, ...], body: str) -> TritonKernel:
    params = ", ".join(f"ptr_{p}" for p in ptrs)
    src = f"@triton.jit\ndef {name}({params}, XBLOCK: tl.constexpr):\n    {body.format(*[f'ptr_{p}' for p in ptrs])}\n"
    return TritonKernel(name=name, source=src, pointer_args=ptrs, size_args=(), xnumel="16", xblock=16,
                        rblock=0, num_warps=4, kind="pointwise")


def test_only_kernels_equal_up_to_names_are_shared():
    body = "tl.store({1} + tl.arange(0, XBLOCK), tl.load({0} + tl.arange(0, XBLOCK)) * 2.0)"
    a = _kernel("k1_mul", ("buf1", "buf2"), body)
    b = _kernel("k7_mul", ("buf10", "buf12"), body)  # the same up to names: shared
    c = _kernel("k9_mul", ("buf3", "buf4"), body.replace("2.0", "3.0"))  # another constant: not
    d = _kernel("k11_mul", ("buf12", "buf10"), body)  # same text, arguments swapped by position: shared
    assert normalized_source(a) == normalized_source(b) == normalized_source(d) != normalized_source(c)
    out, shared = share_identical_kernels([a, b, c, d])
    assert shared == 2 and [k.function for k in out] == ["", "k1_mul", "", "k1_mul"]
    assert "triton_kernels.k1_mul," in out[3].launcher_definition("triton_kernels")
