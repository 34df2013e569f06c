"""GPU checks of kiln's modes: CUDA graph trees (reduce-overhead) and max-autotune.

Run on the GPU machine:  python packages/inductor/tests/gpu_modes_check.py [--only NAME] [--list]
Prints PASS/FAIL per item with measured numbers; exits 1 if any item fails. About 45 s on an H200
(CUDA graph checks ~3 s, autotune ~40 s: Triton compiles each candidate configuration once).
The same checks run under pytest as @pytest.mark.gpu tests (tests/cudagraphs, tests/autotune).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

import torch

from kiln.inductor.autotune import (
    BIAS_GELU,
    NONE,
    AutotuneCache,
    Autotuner,
    DeviceTimer,
    LogProgress,
    TunedMatmul,
    mm_configs,
    tune_kernel,
    tuned_mm,
)
from kiln.inductor.codegen.triton import TritonKernel
from kiln.inductor.cudagraphs import CUDAGraphOptions, CUDAGraphTree, cudagraphify
from kiln.runtime import load_triton_module

DEV = "cuda"


def _tree(name: str) -> CUDAGraphTree:
    return CUDAGraphTree(torch.device("cuda", torch.cuda.current_device()), name=name)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _time_ms(fn: Callable[[], object], iters: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


# --- CUDA graph trees -------------------------------------------------------------------------------

def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor]:
    return (torch.nn.functional.gelu(x @ w1) @ w2 + 1.0,)


def check_replay_equals_eager() -> str:
    w1, w2 = torch.randn(64, 128, device=DEV), torch.randn(128, 32, device=DEV)
    tree = _tree("replay")
    f = cudagraphify(mlp, [torch.randn(8, 64, device=DEV), w1, w2], static_input_indices=(1, 2), tree=tree)
    outs = []
    for _ in range(6):
        x = torch.randn(8, 64, device=DEV)
        outs.append((f(x, w1, w2)[0], mlp(x, w1, w2)[0]))
    for got, want in outs:  # all kept: none overwritten by later replays
        _close(got, want)
    assert f.skip_reason is None, f.skip_reason
    assert (f.stats.warmups, f.stats.recordings, f.stats.replays) == (1, 1, 5), f.stats
    with torch.no_grad():
        w1.mul_(0.5)  # parameters are read in place: an update is seen without re-recording
    x = torch.randn(8, 64, device=DEV)
    _close(f(x, w1, w2)[0], mlp(x, w1, w2)[0])
    assert f.stats.recordings == 1
    return f"{f.stats}; relocated {tree.liveness.relocations} held outputs"


def check_output_aliasing_input() -> str:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.view(-1), x * 2

    f = cudagraphify(fn, [torch.randn(4, 4, device=DEV)], tree=_tree("alias"))
    for _ in range(3):
        x = torch.randn(4, 4, device=DEV)
        v, y = f(x)
        assert v.data_ptr() == x.data_ptr(), "an output that views an input must view the caller's tensor"
        _close(y, x * 2)
    return "view outputs alias the caller's argument"


def check_graph_break_tree() -> str:
    tree = _tree("break")
    w = torch.randn(64, 64, device=DEV)
    first = cudagraphify(lambda x: ((x * 2).sin(),), [torch.randn(16, 64, device=DEV)], tree=tree, name="first")
    second = cudagraphify(lambda a, w: ((a @ w).cos(),), [torch.randn(16, 64, device=DEV), w],
                          static_input_indices=(1,), tree=tree, name="second")

    def model(x: torch.Tensor) -> torch.Tensor:
        (a,) = first(x)
        torch.cuda.synchronize()  # "the graph break": Python runs between the two graphs
        return second(a, w)[0]

    kept = []
    for _ in range(6):
        x = torch.randn(16, 64, device=DEV)
        kept.append((model(x), ((x * 2).sin() @ w).cos()))
    for got, want in kept:
        _close(got, want, 1e-4)
    n1, n2 = first.nodes[0], second.nodes[0]
    assert n2.parent is n1 and n2.slots[0].borrowed is n1.storages[0], tree.as_text()
    assert n2.stats.zero_copy_inputs >= 4, n2.stats
    return f"2 graphs, one pool; second reads first's output in place ({n2.stats.zero_copy_inputs} zero-copy calls)"


def _two_layer_training(tree: CUDAGraphTree | None, device: str = DEV):
    """A training step whose forward and backward are separate graphed callables, as kiln.autograd runs them."""

    def fw(x, w1, w2):
        h = (x @ w1).relu()
        return h @ w2, h

    def bw(x, h, w1, w2, g):
        gw2 = h.t() @ g
        gh = (g @ w2.t()) * (h > 0)
        return x.t() @ gh, gw2

    fw_g = bw_g = None
    if tree is not None:
        ex = [torch.randn(32, 64, device=device), torch.randn(64, 128, device=device),
              torch.randn(128, 16, device=device)]
        fw_g = cudagraphify(fw, ex, static_input_indices=(1, 2), tree=tree, name="forward")
        bw_g = cudagraphify(bw, [ex[0], torch.randn(32, 128, device=device), ex[1], ex[2],
                                 torch.randn(32, 16, device=device)], static_input_indices=(2, 3), tree=tree,
                            name="backward")
    run_fw, run_bw = fw_g or fw, bw_g or bw

    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w1, w2):
            out, h = run_fw(x, w1, w2)
            ctx.save_for_backward(x, h, w1, w2)
            return out

        @staticmethod
        def backward(ctx, g):
            x, h, w1, w2 = ctx.saved_tensors
            gw1, gw2 = run_bw(x, h, w1, w2, g.contiguous())
            return None, gw1, gw2

    return Step, fw_g, bw_g


def _train(tree: CUDAGraphTree | None, steps: int = 6,
           device: str = DEV) -> tuple[list[torch.Tensor], list[float], object, object]:
    step, fw_g, bw_g = _two_layer_training(tree, device)
    torch.manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(64, 128, device=device) * 0.1)
    w2 = torch.nn.Parameter(torch.randn(128, 16, device=device) * 0.1)
    opt = torch.optim.SGD([w1, w2], lr=0.1, momentum=0.9)
    data = [(torch.randn(32, 64, device=device), torch.randn(32, 16, device=device)) for _ in range(steps)]
    losses = []
    for x, y in data:
        out = step.apply(x, w1, w2)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return [w1.detach().clone(), w2.detach().clone()], losses, fw_g, bw_g


def check_training_step_one_tree() -> str:
    tree = _tree("train")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ref_w, ref_losses, _, _ = _train(None)
    eager_peak = torch.cuda.max_memory_allocated() - base
    reserved0 = torch.cuda.memory_reserved()
    got_w, got_losses, fw_g, bw_g = _train(tree)
    pool_growth = torch.cuda.memory_reserved() - reserved0
    for a, b in zip(got_w, ref_w):
        _close(a, b, 1e-4)
    assert all(abs(a - b) < 1e-4 * max(1.0, abs(b)) for a, b in zip(got_losses, ref_losses))
    assert fw_g.skip_reason is None and bw_g.skip_reason is None, (fw_g.skip_reason, bw_g.skip_reason)
    assert fw_g.stats.replays >= 4 and bw_g.stats.replays >= 4, (fw_g.stats, bw_g.stats)
    nf, nb = fw_g.nodes[0], bw_g.nodes[0]
    assert nb.parent is nf and nb.order == nf.order + 1, tree.as_text()
    borrowed = [s for s in nb.slots if s.borrowed is not None]
    assert borrowed and borrowed[0].borrowed.owner == nf.name, "backward should read the saved activation in place"
    return (f"forward+backward in one tree; losses match; backward reads {len(borrowed)} saved tensor(s) in place; "
            f"eager peak {eager_peak / 2**20:.2f} MiB, reserved growth with graphs {pool_growth / 2**20:.2f} MiB")


def _decoder(vocab: int = 512, d: int = 256, layers: int = 4):
    g = torch.Generator(device="cpu").manual_seed(0)
    emb = (torch.randn(vocab, d, generator=g) * 0.5).to(DEV)
    ws = [(torch.randn(d, d, generator=g) / d**0.5).to(DEV) for _ in range(layers)]
    head = (torch.randn(d, vocab, generator=g) / d**0.5).to(DEV)

    def step(tok: torch.Tensor, emb: torch.Tensor, head: torch.Tensor, *ws: torch.Tensor):
        h = emb[tok[:, -1]]
        for w in ws:
            h = h + torch.nn.functional.gelu(torch.nn.functional.layer_norm(h, h.shape[-1:]) @ w)
        logits = h @ head
        return logits.argmax(-1, keepdim=True), logits

    return step, [emb, head, *ws]


def check_decode_loop_without_clone() -> str:
    step, params = _decoder()
    tree = _tree("decode")
    tok0 = torch.tensor([[1]], device=DEV)
    f = cudagraphify(step, [tok0, *params], static_input_indices=range(1, 2 + len(params) - 1), tree=tree)
    tok, ref = tok0, tok0
    toks, logits_kept, ref_toks, ref_logits = [], [], [], []
    for _ in range(24):
        tok, logits = f(tok, *params)  # fed straight back, no .clone()
        ref, rl = step(ref, *params)
        toks.append(tok)
        logits_kept.append(logits)
        ref_toks.append(ref)
        ref_logits.append(rl)
    for a, b in zip(toks, ref_toks):
        assert torch.equal(a, b), "decoded tokens differ from eager"
    for a, b in zip(logits_kept, ref_logits):
        _close(a, b, 1e-4)
    assert tree.stats.eager_fallbacks == 0 and f.stats.replays == 23, (tree.stats, f.stats)

    def eager_loop():
        t = tok0
        for _ in range(16):
            t, _ = step(t, *params)

    def graphed_drop():
        t = tok0
        for _ in range(16):
            t, _ = f(t, *params)

    def graphed_keep():
        t, keep = tok0, []
        for _ in range(16):
            t, lg = f(t, *params)
            keep.append((t, lg))

    e, d, k = (_time_ms(fn, 10) / 16 for fn in (eager_loop, graphed_drop, graphed_keep))
    return (f"24 tokens match eager, {tree.liveness.relocations} relocations; ms/token eager {e:.3f}, "
            f"graphed {d:.3f} ({e / d:.1f}x), graphed keeping every output {k:.3f}")


def check_rerecord_limit() -> str:
    tree = _tree("limit")
    f = cudagraphify(lambda x: (x.cumsum(0) * 2,), [torch.randn(2, device=DEV)], tree=tree,
                     options=CUDAGraphOptions(max_recordings=2))
    for n in (2, 3, 4, 5):
        for _ in range(3):
            x = torch.randn(n, device=DEV)
            _close(f(x)[0], x.cumsum(0) * 2)
    # shapes 2 and 3: a warm-up, a recording and a replay each; shapes 4 and 5 run eagerly on every
    # call (over the limit no warm-up is counted)
    assert len(f.nodes) == 2 and f.stats.warmups == 2 and f.stats.eager_calls == 6, f.stats
    return f"2 shapes recorded, later shapes eager ({f.stats})"


def check_skip_reasons() -> str:
    reasons = {}
    f = cudagraphify(lambda x: (x + 1,), [torch.randn(3)])  # CPU tensors
    f(torch.randn(3))
    reasons["cpu"] = f.skip_reason

    def bump(x):
        x.add_(1)
        return (x * 2,)

    # an input written in place is graphed at its own address (the replay writes the caller's tensor);
    # with graph_written_inputs off the function is not graphed, and says why
    g = cudagraphify(bump, [torch.zeros(3, device=DEV)], tree=_tree("mut"))
    x = torch.zeros(3, device=DEV)
    for i in range(3):
        _close(g(x)[0], torch.full((3,), 2.0 * (i + 1), device=DEV))
    _close(x, torch.full((3,), 3.0, device=DEV))
    y = torch.zeros(3, device=DEV)  # another address: recorded again, and y is the tensor written
    for i in range(3):
        _close(g(y)[0], torch.full((3,), 2.0 * (i + 1), device=DEV))
    _close(y, torch.full((3,), 3.0, device=DEV))
    _close(x, torch.full((3,), 3.0, device=DEV))
    assert g.skip_reason is None and len(g.nodes) == 2, (g.skip_reason, g.stats)
    off = cudagraphify(bump, [torch.zeros(3, device=DEV)], tree=_tree("mut_off"),
                       options=CUDAGraphOptions(graph_written_inputs=False))
    x = torch.zeros(3, device=DEV)
    for i in range(3):
        _close(off(x)[0], torch.full((3,), 2.0 * (i + 1), device=DEV))
    reasons["mutation"] = off.skip_reason

    def sync(x):
        return (x * x.sum().item(),)

    h = cudagraphify(sync, [torch.ones(3, device=DEV)], tree=_tree("sync"))
    for _ in range(3):
        _close(h(torch.ones(3, device=DEV))[0], torch.full((3,), 3.0, device=DEV))
    reasons["sync"] = h.skip_reason
    assert reasons["cpu"] and "cpu" in reasons["cpu"], reasons
    assert reasons["mutation"] and "mutates" in reasons["mutation"], reasons
    assert reasons["sync"] and "synchronises" in reasons["sync"], reasons
    assert not off.nodes and not h.nodes
    return "; ".join(f"{k}: {v.split(';')[0]}" for k, v in reasons.items())


def check_pool_shared_across_graphs() -> str:
    n = 4096

    def big(x):
        t = x.unsqueeze(1).expand(n, 2048).contiguous() * 2  # 2 x 32 MiB of scratch, freed inside the graph
        return (t.sum(1),)

    def grow(tree_for: Callable[[], CUDAGraphTree]) -> int:
        fs = [cudagraphify(big, [torch.randn(n, device=DEV)], tree=tree_for(), name=f"g{i}") for i in range(3)]
        x = torch.randn(n, device=DEV)
        ref = big(x)[0]
        for f in fs:
            f(x)  # warm up
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        r0 = torch.cuda.memory_reserved()
        outs = [f(x)[0] for f in fs]  # record + replay: only graph memory is allocated here
        torch.cuda.synchronize()
        grown = torch.cuda.memory_reserved() - r0
        for o in outs:
            _close(o, ref, 1e-3)
        return grown

    shared = _tree("shared")
    one = grow(lambda: shared)
    separate = grow(lambda: _tree("separate"))
    # one graph's scratch is 64 MiB: a shared pool holds it once, separate pools three times
    assert one * 2 < separate, (one, separate)
    assert one <= 80 * 2**20, f"one tree grew by {one / 2**20:.1f} MiB for 3 graphs with 64 MiB scratch each"
    return f"3 graphs x 64 MiB scratch: one tree +{one / 2**20:.0f} MiB, separate pools +{separate / 2**20:.0f} MiB"


def _private_pool_bytes() -> int:
    return sum(int(seg["total_size"]) for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))


class _Deep(torch.nn.Module):
    """Eight Linear+GELU layers at batch 2048: 8 MiB per activation, saved twice per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x
        kept = None
        for i, layer in enumerate(self.layers):
            h = torch.nn.functional.gelu(layer(h))
            if i == 3:
                kept = h  # returned as well as saved: the caller may keep it past the backward
        return h, kept


def _deep_steps(compiled: Callable[..., object], model: torch.nn.Module, x: torch.Tensor, steps: int = 5):
    """Steps 1-3 warm up, record and replay; the last two backward twice (retain_graph: autograd keeps
    the saved activations, so they are not handed over and the donated memory must not be reused)."""
    kept, grads = [], []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        out, mid = compiled(x)
        loss = out.square().mean() + mid.mean()
        if step >= 3:
            loss.backward(retain_graph=True)
        loss.backward()
        kept.append(mid)
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads, kept


def check_training_pool_donation() -> str:
    """kiln.compile(mode="reduce-overhead") training: the backward's recording reuses the saved
    activations it reads (pool smaller than without donation) and results equal eager's, also for an
    activation the caller keeps and for retain_graph."""
    import kiln
    from kiln.inductor.cudagraphs import function as cg_function

    torch.manual_seed(0)
    model = _Deep().to(DEV)
    x = torch.randn(2048, 1024, device=DEV)
    ref_grads, ref_kept = _deep_steps(model, model, x)
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    # the plain step's own segments in a fresh private pool, backward thread included: like for like
    private = torch.cuda.MemPool()
    torch._C._cuda_beginAllocateToPool(torch.cuda.current_device(), private.id)
    try:
        out, mid = model(x)
        (out.square().mean() + mid.mean()).backward()
        torch.cuda.synchronize()
    finally:
        torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), private.id)
    eager_pool = sum(int(seg["total_size"]) for seg in torch.cuda.memory_snapshot()
                     if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(private.id))
    del out, mid
    model.zero_grad(set_to_none=True)

    pools, stats = {}, {}
    original = cg_function.CUDAGraphOptions
    for donate in (False, True):
        kiln.reset()
        gc.collect()
        torch.cuda.empty_cache()
        before = _private_pool_bytes()
        cg_function.CUDAGraphOptions = functools.partial(original, donate_saved=donate)  # type: ignore[misc]
        try:
            compiled = kiln.compile(model, mode="reduce-overhead")
            grads, kept = _deep_steps(compiled, model, x)
        finally:
            cg_function.CUDAGraphOptions = original  # type: ignore[misc]
        torch.cuda.synchronize()
        pools[donate] = _private_pool_bytes() - before
        tree = cg_function.default_tree(x.device)
        stats[donate] = tree.liveness
        # the backward reads the weights the forward saved in place, as the forward does (no slots)
        weights = {p.data_ptr() for p in model.parameters()}
        assert weights & {ptr for n in tree.nodes[1:] for ptr in n.static_ptrs}, tree.as_text()
        for step_grads, step_ref in zip(grads, ref_grads):
            for g, r in zip(step_grads, step_ref):
                _close(g, r, 2e-3)
        for k, r in zip(kept, ref_kept):  # every step's kept activation, read after later steps ran
            _close(k, r, 2e-3)
        del compiled, grads, kept
    kiln.reset()
    assert stats[True].donated > 0, "no saved activation was donated to the backward's recording"
    assert stats[True].donated_held == 0, stats[True]  # every donated activation was freed after its last read
    assert pools[True] <= pools[False], pools
    assert pools[True] <= 1.2 * eager_pool, (pools, eager_pool)
    mb = 2**20
    return (f"pool {pools[True] / mb:.0f} MiB with donation ({stats[True].donated} storages, "
            f"{stats[True].donated_bytes / mb:.0f} MiB) vs {pools[False] / mb:.0f} MiB without; the plain step in a "
            f"private pool {eager_pool / mb:.0f} MiB (ratio {pools[True] / eager_pool:.2f}); grads and kept "
            f"activations equal eager's")


CUDAGRAPH_CHECKS: dict[str, Callable[[], str]] = {
    "cudagraphs.replay_equals_eager": check_replay_equals_eager,
    "cudagraphs.output_aliasing_input": check_output_aliasing_input,
    "cudagraphs.graph_break_tree": check_graph_break_tree,
    "cudagraphs.training_step_one_tree": check_training_step_one_tree,
    "cudagraphs.decode_loop_without_clone": check_decode_loop_without_clone,
    "cudagraphs.rerecord_limit": check_rerecord_limit,
    "cudagraphs.skip_reasons": check_skip_reasons,
    "cudagraphs.pool_shared_across_graphs": check_pool_shared_across_graphs,
    "cudagraphs.training_pool_donation": check_training_pool_donation,
}

# --- max-autotune -----------------------------------------------------------------------------------

_TMP: list[str] = []  # one fresh cache folder per run, made on first use


def _tmp() -> str:
    if not _TMP:
        _TMP.append(tempfile.mkdtemp(prefix="kiln-autotune-check-"))
    return _TMP[0]


def _tuner(name: str) -> Autotuner:
    return Autotuner(DeviceTimer(warmup_ms=2, rep_ms=10), AutotuneCache(os.path.join(_tmp(), f"{name}.json")),
                     LogProgress())


def check_matmul_template_vs_cublas() -> str:
    lines = []
    for m, k, n in ((8, 1024, 1024), (1024, 1024, 1024)):
        torch.manual_seed(0)
        a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16) / k**0.5
        bias = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        tuner = _tuner("mm")
        configs = mm_configs(m, n, k, limit=6)
        t = tuned_mm(a, b, tuner=tuner, epilogue=BIAS_GELU, epilogue_args=(bias,), configs=configs)
        want = BIAS_GELU.torch_fn(a.float() @ b.float(), bias.float())
        torch.testing.assert_close(t(a, b, bias).float(), want, rtol=2e-2, atol=2e-2)
        assert t.choice is not None and not t.choice.cached
        timings = t.choice.timings
        cublas = timings["cublas"]
        best_template = min(v for kk, v in timings.items() if kk != "cublas")
        assert t.choice.ms <= cublas, (t.choice.ms, cublas)  # the extern is kept unless beaten
        # every template config computes the same product
        for c in configs[:2]:
            torch.testing.assert_close(TunedMatmul(BIAS_GELU, c, a.dtype)(a, b, bias).float(), want,
                                       rtol=2e-2, atol=2e-2)
        again = tuned_mm(a, b, tuner=tuner, epilogue=BIAS_GELU, epilogue_args=(bias,), configs=configs)
        assert again.choice is not None and again.choice.cached and again.config == t.config
        lines.append(f"{m}x{k}x{n}: cublas+epilogue {cublas * 1e3:.1f} us, best template {best_template * 1e3:.1f} us"
                     f" -> {'template' if t.uses_template else 'cublas'}")
    # no epilogue: cuBLAS alone is hard to beat; the choice must still be the faster one
    a = torch.randn(2048, 2048, device=DEV, dtype=torch.bfloat16)
    t = tuned_mm(a, a, tuner=_tuner("mm"), epilogue=NONE, configs=mm_configs(2048, 2048, 2048, limit=4))
    lines.append(f"2048^3 plain: {'template' if t.uses_template else 'cublas'} {t.choice.ms * 1e3:.1f} us")
    return "; ".join(lines)


_KERNELS = """
import triton
import triton.language as tl


@triton.jit
def kiln_gelu_add(in0, in1, out0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    v = tl.load(in0 + xindex, mask=xmask, other=0.0).to(tl.float32) + tl.load(in1 + xindex, mask=xmask, other=0.0).to(tl.float32)
    y = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    tl.store(out0 + xindex, y.to(out0.dtype.element_ty), mask=xmask)


@triton.jit
def kiln_softmax(in0, out0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    mask = (xindex < xnumel) & (rindex < rnumel)
    x = tl.load(in0 + xindex * rnumel + rindex, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.where(mask, tl.exp(x - tl.max(x, 1)[:, None]), 0.0)
    tl.store(out0 + xindex * rnumel + rindex, (e / tl.sum(e, 1)[:, None]).to(out0.dtype.element_ty), mask=mask)
"""




def check_generated_kernels_tuned() -> str:
    import triton

    mod = load_triton_module(_KERNELS)
    timer = DeviceTimer(warmup_ms=2, rep_ms=10)
    lines = []
    x, y = (torch.randn(1 << 22, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    rows = torch.randn(4096, 1000, device=DEV)
    problems = [
        (TritonKernel("kiln_gelu_add", _KERNELS, ("in0", "in1", "out0"), ("xnumel",), "xnumel", 1024, 0, 4,
                    "pointwise"), [x, y, torch.empty_like(x), x.numel()], {"xnumel": x.numel()}),
        (TritonKernel("kiln_softmax", _KERNELS, ("in0", "out0"), ("xnumel", "rnumel"), "xnumel", 4, 1024, 4,
                    "persistent_reduction"), [rows, torch.empty_like(rows), 4096, 1000],
         {"xnumel": 4096, "rnumel": 1000}),
    ]
    for k, args, sizes in problems:
        fn = getattr(mod, k.name)

        def run(kk, args=args, sizes=sizes, fn=fn):
            consts = {"XBLOCK": kk.xblock, **({"RBLOCK": kk.rblock} if kk.rblock else {})}
            grid = (triton.cdiv(sizes["xnumel"], kk.xblock), 1, 1)
            return lambda: fn[grid](*args, **consts, num_warps=kk.num_warps, num_stages=1)

        out = args[len(k.pointer_args) - 1]
        run(k)()
        default_out = out.clone()
        tuned, choice = tune_kernel(k, fn, args, tuner=_tuner("kernels"), sizes=sizes, limit=8)
        out.zero_()
        run(tuned)()
        torch.testing.assert_close(out, default_out, rtol=1e-5, atol=1e-5)
        t_default, t_tuned = timer(run(k), "default"), timer(run(tuned), "tuned")
        assert t_tuned <= t_default * 1.15, (k.name, t_tuned, t_default)  # re-measured: allow noise
        lines.append(f"{k.name}: default {t_default * 1e3:.1f} us, tuned {choice.config.label} {t_tuned * 1e3:.1f} us")
    return "; ".join(lines)


def check_autotune_cache_second_process() -> str:
    import subprocess

    path = os.path.join(_tmp(), "proc.json")
    code = (
        "import sys, torch\n"
        "from kiln.inductor.autotune import AutotuneCache, Autotuner, DeviceTimer, NONE, mm_configs, tuned_mm\n"
        "a = torch.randn(256, 256, device='cuda', dtype=torch.bfloat16)\n"
        "class T(DeviceTimer):\n"
        "    def __call__(self, launch, label):\n"
        "        if sys.argv[1] == 'second': raise SystemExit('re-tuned in the second process')\n"
        "        return super().__call__(launch, label)\n"
        f"t = tuned_mm(a, a, tuner=Autotuner(T(2, 5), AutotuneCache({path!r})), epilogue=NONE, "
        "configs=mm_configs(256, 256, 256, limit=3))\n"
        "print(t.choice.cached, t.config.label)\n")
    outs = []
    for which in ("first", "second"):
        r = subprocess.run([sys.executable, "-c", code, which], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(r.stdout.split())
    assert outs[0][0] == "False" and outs[1][0] == "True" and outs[0][1] == outs[1][1], outs
    return f"second process reused {outs[1][1]} from {path}"


AUTOTUNE_CHECKS: dict[str, Callable[[], str]] = {
    "autotune.matmul_template_vs_cublas": check_matmul_template_vs_cublas,
    "autotune.generated_kernels_tuned": check_generated_kernels_tuned,
    "autotune.cache_second_process": check_autotune_cache_second_process,
}

ALL_CHECKS: dict[str, Callable[[], str]] = {**CUDAGRAPH_CHECKS, **AUTOTUNE_CHECKS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", action="append", default=[], help="run checks whose name contains this")
    ap.add_argument("--list", action="store_true")
    ns = ap.parse_args(argv)
    if ns.list:
        print("\n".join(ALL_CHECKS))
        return 0
    if not torch.cuda.is_available():
        print("FAIL  no CUDA device: these checks need a GPU")
        return 1
    os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-modes-check-"))
    print(f"kiln modes GPU check on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    failed = 0
    t_all = time.perf_counter()
    for name, fn in ALL_CHECKS.items():
        if ns.only and not any(o in name for o in ns.only):
            continue
        t0 = time.perf_counter()
        try:
            info = fn()
            print(f"PASS  {name:<42} {time.perf_counter() - t0:5.1f}s  {info}", flush=True)
        except Exception as e:  # report every item, keep going
            failed += 1
            print(f"FAIL  {name:<42} {time.perf_counter() - t0:5.1f}s  {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    print(f"{'FAILED' if failed else 'ALL PASSED'}: {failed} failure(s), {time.perf_counter() - t_all:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
