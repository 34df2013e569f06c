"""End-to-end inference graphs with symbolic batch/sequence sizes and static weights: one compile
serves every size (C++ path and Triton interpreter), called repeatedly with fresh inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dynamic_helpers import BACKENDS, assumed, check_sizes, compile_symbolic, symbolic_fakes_graph

from kiln.inductor import InductorOptions
from kiln.inductor.lowering.lower import lower_graph

torch.manual_seed(0)
D, H, F_ = 16, 2, 32


def mlp(x, w1, b1, w2, b2, g, b):
    h = F.gelu(F.linear(F.layer_norm(x, (D,), g, b), w1, b1))
    return (x + F.linear(h, w2, b2),)


def attention_block(x, wqkv, wo, g, b, w1, w2):
    bsz, t, _ = x.shape
    h = F.layer_norm(x, (D,), g, b)
    q, k, v = F.linear(h, wqkv).split(D, -1)
    q, k, v = (z.view(bsz, t, H, D // H).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-1, -2)) * (D // H) ** -0.5
    mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(bsz, t, D)
    x = x + F.linear(y, wo)
    return (x + F.linear(F.relu(F.linear(x, w1)), w2),)


def _mlp_args(n):
    return (torch.randn(n, D), torch.randn(F_, D) * 0.2, torch.randn(F_), torch.randn(D, F_) * 0.2,
            torch.randn(D), torch.randn(D), torch.randn(D))


WEIGHTS = (torch.randn(3 * D, D) * 0.2, torch.randn(D, D) * 0.2, torch.randn(D), torch.randn(D),
           torch.randn(F_, D) * 0.2, torch.randn(D, F_) * 0.2)


def _attn_args(n):
    return (torch.randn(1 + n % 3, n, D), *WEIGHTS)


@pytest.mark.parametrize("options", BACKENDS)
def test_mlp_one_compile_all_batch_sizes(options):
    cg = compile_symbolic(mlp, *_mlp_args(37), options=options, dynamic={0: (0,)})
    assert cg.loop_program.sizes and not assumed(cg.loop_program)  # type: ignore[attr-defined]
    check_sizes(cg, mlp, _mlp_args, (1, 2, 3, 0, 5, 17, 64, 101), atol=1e-4)


@pytest.mark.parametrize("options", BACKENDS)
def test_attention_block_batch_and_sequence(options):
    cg = compile_symbolic(attention_block, torch.randn(3, 37, D), *WEIGHTS, options=options,
                          dynamic={0: (0, 1)})
    p = cg.loop_program  # type: ignore[attr-defined]
    assert len(p.sizes) == 2 and not assumed(p), p.as_text()
    check_sizes(cg, attention_block, _attn_args, (1, 2, 3, 7, 13, 31), atol=1e-4)


def test_fully_symbolic_mlp_weights_too():
    """Every dim symbolic (dynamic=True style), weights included."""
    cg = compile_symbolic(mlp, *_mlp_args(37))
    check_sizes(cg, mlp, _mlp_args, (1, 2, 9, 40), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_triton_kernels_over_many_sizes(dtype):
    """Generated Triton kernels on the GPU with sizes as arguments: one compile, many sizes."""
    dev = "cuda"
    w = tuple(t.to(dev, dtype) for t in WEIGHTS)

    def args(n):
        return (torch.randn(1 + n % 3, n, D, device=dev, dtype=dtype), *w)
    cg = compile_symbolic(attention_block, *args(37), dynamic={0: (0, 1)})
    tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {"atol": 1e-4}
    check_sizes(cg, attention_block, args, (1, 2, 3, 7, 13, 31, 64, 127, 128, 129, 511, 1000), **tol)
    cg = compile_symbolic(mlp, *(t.to(dev, dtype) for t in _mlp_args(37)), dynamic={0: (0,)})
    check_sizes(cg, mlp, lambda n: tuple(t.to(dev, dtype) for t in _mlp_args(n)),
                (0, 1, 2, 5, 17, 64, 1023, 1024, 1025, 4097), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_test_graphs_lower_for_cuda_with_symbolic_sizes(dtype: torch.dtype) -> None:
    """The graphs of test_gpu_triton_kernels_over_many_sizes, traced on fake CUDA tensors as that GPU
    test traces them (its trace failed on torch 2.11 without the Python dispatcher), lower with every
    size symbolic and no size assumption (a CUDA build of torch makes fake CUDA tensors without a GPU)."""
    for fn, shapes, dynamic in ((attention_block, [(3, 37, 16)] + [tuple(w.shape) for w in WEIGHTS], {0: (0, 1)}),
                                (mlp, [tuple(t.shape) for t in _mlp_args(37)], {0: (0,)})):
        gm, examples, env = symbolic_fakes_graph(fn, shapes, dynamic, device="cuda", dtype=dtype)
        program, fallbacks = lower_graph(gm, examples, InductorOptions(strict_lowering=True), fn.__name__)
        assert not fallbacks and not assumed(program), (fallbacks, assumed(program))
        assert len(program.sizes) == len(dynamic[0])
        assert not env.replacements, env.replacements


def fwd_bwd(x, w, g, b):
    """A training step's forward + backward as one ATen graph (gradients of a LayerNorm/GELU/softmax
    head), traced with a symbolic batch."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = F.gelu(F.layer_norm(x @ w, (w.shape[1],), g, b)).softmax(-1)
    return torch.autograd.grad((y * y).sum(), (x, w))


@pytest.mark.parametrize("options", BACKENDS)
def test_forward_backward_graph_symbolic_batch(options):
    def args(n):
        return (torch.randn(n, 8), torch.randn(8, 6), torch.randn(6), torch.randn(6))
    cg = compile_symbolic(fwd_bwd, *args(37), options=options, dynamic={0: (0,)})
    assert not assumed(cg.loop_program)  # type: ignore[attr-defined]
    check_sizes(cg, fwd_bwd, args, (1, 2, 3, 0, 17, 64), atol=1e-4)
