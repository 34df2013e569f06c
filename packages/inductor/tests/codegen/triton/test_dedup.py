"""Identical layers' kernels share one Triton function (compiled once); results still match eager."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from dynamic_helpers import TRITON, check_sizes, compile_symbolic, needs_triton
from tracer import trace

from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.dedup import normalized_source, share_identical_kernels
from kiln.inductor.codegen.triton.kernel import TritonKernel, generate_kernels
from kiln.inductor.codegen.triton.memo import KernelMemo
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.ir import Kernel

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


def _sized(name: str, ptrs: tuple[str, ...], sizes: tuple[str, ...], body: str) -> TritonKernel:
    params = ", ".join([f"ptr_{p}" for p in ptrs] + [f'{s}: "i64"' for s in sizes])
    src = (f"@triton.jit(do_not_specialize={list(sizes)!r})\ndef {name}({params}, XBLOCK: tl.constexpr):\n"
           f"    {body.format(*[f'ptr_{p}' for p in ptrs], *sizes)}\n")
    return TritonKernel(name=name, source=src, pointer_args=ptrs, size_args=sizes, xnumel="*".join(sizes),
                        xblock=16, rblock=0, num_warps=4, kind="pointwise")


def test_symbolic_twins_are_shared_with_sizes_numbered_by_position():
    """Kernels with symbolic sizes are twins when equal up to kernel, pointer and size names (each
    launcher passes its own sizes, by position); a size used in another role is another kernel."""
    body = "x = tl.arange(0, XBLOCK)\n    tl.store({1} + x, tl.load({0} + x, x < {2} * {3}) * 2.0)"
    a = _sized("k1_mul", ("buf1", "buf2"), ("s0", "s1"), body)
    b = _sized("k5_mul", ("buf7", "buf8"), ("s0", "s1"), body)  # another layer, same sizes
    c = _sized("k9_mul", ("buf3", "buf4"), ("s2", "s7"), body)  # other size symbols, same roles
    d = _sized("k11_mul", ("buf5", "buf6"), ("s0", "s1"), body.replace("{2} * {3}", "{2} + {3}"))
    out, shared = share_identical_kernels([a, b, c, d])
    assert shared == 2 and [k.function for k in out] == ["", "k1_mul", "k1_mul", ""]
    assert "triton_kernels.k1_mul," in out[2].launcher_definition("triton_kernels")
    assert out[2].launch_code("triton_kernels").endswith(", buf3, buf4, s2, s7)")  # its own sizes


@needs_triton  # CPU tensors through the interpreter
def test_identical_symbolic_layers_share_functions_and_match_eager_over_sizes():
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(32, 32, generator=g) * 0.2 for _ in range(4)]
    cg = compile_symbolic(_layers, torch.randn(37, 32, generator=g), *ws, options=TRITON, dynamic={0: (0,)})
    src = cg.texts["output_code"]
    functions = set(re.findall(r"^def (k\w+)\(", src, re.M))
    launchers = re.findall(r"^(_launch_k\w+) = _KilnLaunch\(triton_kernels\.(\w+),", src, re.M)
    assert "do_not_specialize" in src and len(functions) < len(launchers), (functions, launchers)
    check_sizes(cg, _layers, lambda n: (torch.randn(n, 32), *ws), (0, 1, 7, 16, 33, 512), atol=1e-4)


def _chain(x, *ws):  # each layer's kernel reads the matmul before it: one form per layer
    for w in ws:
        x = F.gelu(F.layer_norm(x @ w, x.shape[-1:]))
    return (x,)


def test_kernels_of_one_form_are_generated_once_with_their_own_names():
    """memo.py: the later layers' kernels come from the first layer's with their buffers and names put
    back, the same kernels as generating each one (names, sources, pointers, blocks); values as eager's."""
    dev = device()
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(8, 32, generator=g).to(dev)] + [torch.randn(32, 32, generator=g).to(dev) for _ in range(4)]
    cg = compile_graph(trace(_chain, *args), args, options=OPTIONS)
    kernels = [k for k in cg.scheduled.launched() if isinstance(k, Kernel)]
    memo = KernelMemo()
    for k in kernels:
        assert memo.generate(k, generate_kernels) == generate_kernels(k)
    assert (len(kernels), len(memo.forms), memo.hits) == (4, 1, 3)
    fresh = [a * 1.5 for a in args]
    torch.testing.assert_close(cg.fn(*fresh)[0], _chain(*fresh)[0], rtol=1e-4, atol=1e-5)
