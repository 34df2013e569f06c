"""Triton kernel groups (scheduler/horizontal.py with codegen/triton/group.py): independent flat kernels
of a graph -- pointwise kernels and scatters written in place -- launched as one kernel whose programs
are split between them. Each test compares with eager over several calls with fresh inputs and checks
the grouping in the schedule and in the generated launches. Under the interpreter on CPU here, on the
GPU there (conftest.py)."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from dynamic_helpers import check_sizes, compile_symbolic
from tracer import trace

from kiln.graph import GraphAnnotations, annotate
from kiln.inductor import InductorOptions, compile_graph
from kiln.inductor.codegen.triton.testing import device
from kiln.inductor.ir import KernelGroup

OPTIONS = InductorOptions(cpu_backend="triton")
UNGROUPED = InductorOptions(cpu_backend="triton", group_kernels=False)


def _groups(cg) -> list[KernelGroup]:
    return [w for w in cg.scheduled.launched() if isinstance(w, KernelGroup)]


def _launches(cg) -> int:
    """Kernel launches of the generated wrapper."""
    return len(re.findall(r"^\s*(?:\(|if .*: )?_launch_\w+\(", cg.texts["output_code"], flags=re.M))


def _rand(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device())


def _independent(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # four results that share no kernel: each is a pointwise kernel of its own size
    return (a.sin() * 2, b.relu() + 1, torch.exp(c) - c, d.t().contiguous().abs() if d.dim() == 2 else d.abs())


def test_independent_pointwise_kernels_are_one_launch() -> None:
    shapes = [(37,), (1,), (13, 7), (1031,)]  # a prime, one element, 2-d, above one block
    args = [_rand(0, *s) for s in shapes]
    cg = compile_graph(trace(_independent, *args), args, options=OPTIONS)
    (group,) = _groups(cg)
    assert len(group.parts) == 4
    assert _launches(cg) == 1, cg.texts["output_code"]
    for call in range(3):  # fresh inputs every call
        fresh = [_rand(10 + call, *s) for s in shapes]
        for got, want in zip(cg.fn(*fresh), _independent(*fresh)):
            torch.testing.assert_close(got, want)


def test_grouping_off_launches_each_kernel() -> None:
    shapes = [(37,), (1,), (13, 7), (1031,)]
    args = [_rand(0, *s) for s in shapes]
    cg = compile_graph(trace(_independent, *args), args, options=UNGROUPED)
    assert not _groups(cg) and _launches(cg) == 4


def test_a_transposing_part_launches_alone_after_the_group() -> None:
    # d.t().contiguous() of a (64, 48) matrix is a 2-D tiled kernel: not one flat launch
    shapes = [(37,), (5,), (100,), (64, 48)]
    args = [_rand(1, *s) for s in shapes]
    cg = compile_graph(trace(_independent, *args), args, options=OPTIONS)
    assert _launches(cg) == 2, cg.texts["output_code"]
    for got, want in zip(cg.fn(*args), _independent(*args)):
        torch.testing.assert_close(got, want)


def _kv_step(k_cache: torch.Tensor, v_cache: torch.Tensor, qkv: torch.Tensor, pos: torch.Tensor,
             cos: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A decode step's cache writes beside the query's rotation: three independent flat kernels."""
    q, k, v = qkv.unbind(0)
    k_new = k_cache.index_put((pos,), (k * cos).unsqueeze(0))
    v_new = v_cache.index_put((pos,), v.unsqueeze(0))
    return k_new, v_new, q * cos + 1


def test_kv_cache_writes_and_the_query_are_one_launch_and_write_the_caches_in_place() -> None:
    seq, dim = 16, 24
    example = [torch.zeros(seq, dim, device=device()), torch.zeros(seq, dim, device=device()), _rand(0, 3, dim),
               torch.tensor([0], device=device()), _rand(1, dim)]
    gm = trace(_kv_step, *example)
    annotate(gm, GraphAnnotations(input_mutations=((0, 0), (1, 1))))
    cg = compile_graph(gm, example, options=OPTIONS)
    (group,) = _groups(cg)
    assert len(group.parts) == 3 and _launches(cg) == 1, cg.texts["output_code"]
    k_cache, v_cache = torch.zeros(seq, dim, device=device()), torch.zeros(seq, dim, device=device())
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    for step in range(5):  # fresh values and a new position every call; the caches accumulate
        qkv, cos, pos = _rand(20 + step, 3, dim), _rand(40 + step, dim), torch.tensor([3 * step + 1], device=device())
        k_out, v_out, q = cg.fn(k_cache, v_cache, qkv, pos, cos)
        k_ref, v_ref, q_ref = _kv_step(k_ref, v_ref, qkv, pos, cos)
        assert k_out.data_ptr() == k_cache.data_ptr() and v_out.data_ptr() == v_cache.data_ptr()
        torch.testing.assert_close(k_cache, k_ref)
        torch.testing.assert_close(v_cache, v_ref)
        torch.testing.assert_close(q, q_ref)


def test_groups_over_symbolic_sizes() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sigmoid() * 3, y.cos() - y

    cg = compile_symbolic(f, _rand(0, 33, 5), _rand(1, 7), options=OPTIONS)
    assert len(_groups(cg)) == 1 and _launches(cg) == 1, cg.texts["output_code"]
    check_sizes(cg, f, lambda n: (_rand(n, n, 5), _rand(n + 100, 2 * n + 1)), [0, 1, 2, 7, 97, 300])


L, S, H, D = 2, 16, 2, 8  # layers, cache length, heads, head dim


def _decoder(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, pos: torch.Tensor,
             *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A decode step through L layers: each writes its key and value caches and rotates its query."""
    written = []
    for layer in range(L):
        q, k, v = torch.mm(x, w).view(1, 3, H, D).unbind(1)
        kc = caches[2 * layer].index_put((pos,), k * cos)
        vc = caches[2 * layer + 1].index_put((pos,), v)
        y = F.scaled_dot_product_attention((q * cos).unsqueeze(0).transpose(1, 2), kc.unsqueeze(0).transpose(1, 2),
                                           vc.unsqueeze(0).transpose(1, 2))
        x = y.transpose(1, 2).reshape(1, H * D)
        written += [kc, vc]
    return (x, *written)  # the new caches: written over the old ones (the graph's input mutations)


def test_layers_groups_share_one_function_and_decode_like_eager() -> None:
    w, cos = _rand(1, H * D, 3 * H * D) * 0.3, _rand(2, D)
    example = [_rand(0, 1, H * D), w, cos, torch.tensor([0], device=device()),
               *(torch.zeros(S, H, D, device=device()) for _ in range(2 * L))]
    gm = trace(_decoder, *example)
    annotate(gm, GraphAnnotations(input_mutations=tuple((1 + i, 4 + i) for i in range(2 * L))))
    cg = compile_graph(gm, example, options=OPTIONS)
    groups = _groups(cg)
    assert len(groups) == L and all(len(g.parts) == 3 for g in groups)
    code = cg.texts["output_code"]
    group_launchers = re.findall(r"^_launch_group\d+ = _KilnLaunch\(triton_kernels\.(\w+),", code, flags=re.M)
    assert len(group_launchers) == L and len(set(group_launchers)) == 1, group_launchers  # compiled once
    caches = [torch.zeros(S, H, D, device=device()) for _ in range(2 * L)]
    ref = [c.clone() for c in caches]
    for step in range(4):  # fresh input and position each step; the caches fill up
        x, pos = _rand(10 + step, 1, H * D), torch.tensor([step * 3], device=device())
        got = cg.fn(x, w, cos, pos, *caches)
        want = _decoder(x, w, cos, pos, *ref)
        ref = list(want[1:])
        torch.testing.assert_close(got[0], want[0])
        for c, r in zip(caches, ref):
            torch.testing.assert_close(c, r)
