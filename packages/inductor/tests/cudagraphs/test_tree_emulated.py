"""The tree's bookkeeping on CPU, through EmulatedGraphEngine (captures without side effects, replays that
overwrite outputs in place): warm-up/record/replay, liveness and relocation, graph breaks, limits, skips."""

from __future__ import annotations

import logging

import pytest
import torch

from kiln.inductor.cudagraphs import (
    CUDAGraphOptions,
    CUDAGraphTree,
    EmulatedGraphEngine,
    cudagraphify,
)


def make_tree() -> CUDAGraphTree:
    return CUDAGraphTree("cpu", engine=EmulatedGraphEngine(), name="test")


def graphed(fn, args, static=(), tree=None, written_inputs=(), **opts):
    tree = tree or make_tree()
    return cudagraphify(fn, args, static_input_indices=static, tree=tree,
                        options=CUDAGraphOptions(**opts), written_inputs=written_inputs), tree


def mlp(x, w):
    return ((x @ w).relu() + 1.0,)


def test_warmup_record_replay_equals_eager():
    w = torch.randn(8, 8)
    f, tree = graphed(mlp, [torch.randn(4, 8), w], static=(1,))
    for _ in range(4):
        x = torch.randn(4, 8)
        (out,) = f(x, w)
        torch.testing.assert_close(out, mlp(x, w)[0])
    assert (f.stats.warmups, f.stats.recordings, f.stats.replays) == (1, 1, 3)
    assert tree.stats.replays == 3 and len(tree.nodes) == 1
    node = tree.nodes[0]
    assert node.stats.input_copies >= 3  # x is copied into its slot, w (static) is not
    assert [s.index for s in node.slots] == [0] and node.static_indices == (1,)


def test_replay_overwrites_outputs_when_unprotected():
    """The hazard kiln guards against: with relocation off and a view held, the call falls back."""
    w = torch.randn(8, 8)
    f, tree = graphed(mlp, [torch.randn(4, 8), w], static=(1,))
    x1, x2, x3 = (torch.randn(4, 8) for _ in range(3))
    f(x1, w)
    (o2,) = f(x2, w)  # recorded + replayed: o2 aliases the graph's output memory
    view = o2[0]  # a view kiln did not hand out and cannot re-point
    expected = mlp(x2, w)[0][0].clone()
    (o3,) = f(x3, w)  # must not overwrite `view`: runs eagerly instead
    torch.testing.assert_close(view, expected)
    torch.testing.assert_close(o3, mlp(x3, w)[0])
    assert tree.stats.eager_fallbacks == 1
    assert tree.nodes[0].storages[0].copy_out  # from now on this output is handed out as a copy
    (o4,) = f(x1, w)
    torch.testing.assert_close(o4, mlp(x1, w)[0])
    torch.testing.assert_close(o3, mlp(x3, w)[0])


def step(tok, emb):
    # a decode step: the next "token" depends on the previous one
    return ((tok @ emb).tanh() * 0.5 + tok,)


def test_decode_loop_feeding_outputs_back_without_clone():
    emb = torch.randn(16, 16) * 0.3
    f, tree = graphed(step, [torch.randn(1, 16), emb], static=(1,))
    tok = torch.randn(1, 16)
    ref = tok.clone()
    kept, refs = [], []
    for _ in range(10):
        (tok,) = f(tok, emb)
        (ref,) = step(ref, emb)
        kept.append(tok)  # kept without .clone(): still correct after later replays
        refs.append(ref)
    for got, want in zip(kept, refs):
        torch.testing.assert_close(got, want)
    assert tree.stats.eager_fallbacks == 0
    assert tree.liveness.relocations >= 7  # each held token moved once before the next replay
    assert f.stats.replays == 9


def test_decode_loop_rebinding_output_matches_eager():
    emb = torch.randn(16, 16) * 0.3
    f, tree = graphed(step, [torch.randn(1, 16), emb], static=(1,))
    tok = torch.randn(1, 16)
    ref = tok.clone()
    for _ in range(7):
        (tok,) = f(tok, emb)
        (ref,) = step(ref, emb)
    torch.testing.assert_close(tok, ref)
    # the previous token is alive only as the argument: at most one small relocation per replay
    assert tree.liveness.relocations <= 6 and tree.stats.eager_fallbacks == 0


def test_graph_break_tree_borrows_producer_output():
    w = torch.randn(8, 8)
    first, tree = graphed(lambda x: ((x * 2).sin(),), [torch.randn(4, 8)])
    second, _ = graphed(lambda a, w: ((a @ w).cos(),), [torch.randn(4, 8), w], static=(1,), tree=tree)

    def model(x):
        (a,) = first(x)
        return second(a, w)[0]

    def eager(x):
        return ((x * 2).sin() @ w).cos()

    outs = []
    for _ in range(5):
        x = torch.randn(4, 8)
        outs.append((model(x), eager(x)))
    for got, want in outs:  # every output kept, still correct
        torch.testing.assert_close(got, want)
    n_first, n_second = first.nodes[0], second.nodes[0]
    assert n_second.parent is n_first and n_first.children == [n_second]
    assert n_second.order > n_first.order
    # the second graph reads the first graph's output in place: no copy when fed its latest output
    assert n_second.slots[0].borrowed is n_first.storages[0]
    assert n_second.stats.zero_copy_inputs >= 3
    text = tree.as_text()
    assert "borrow<" in text and len(text.splitlines()) == 3


def test_graph_break_consumer_called_with_other_input_copies_into_borrowed_slot():
    first, tree = graphed(lambda x: (x + 1,), [torch.randn(4)])
    second, _ = graphed(lambda a: (a * 3,), [torch.randn(4)], tree=tree)
    for _ in range(3):
        second(first(torch.randn(4))[0])
    (held,) = first(torch.ones(4))  # user keeps the producer's output
    other = torch.full((4,), 5.0)
    (out,) = second(other)  # must copy into the borrowed slot without clobbering `held`
    torch.testing.assert_close(out, other * 3)
    torch.testing.assert_close(held, torch.full((4,), 2.0))


def test_rerecord_limit_then_eager(caplog):
    f, tree = graphed(lambda x: (x.cumsum(0),), [torch.randn(2)], max_recordings=2)
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for n in (2, 3, 4, 5):
            for _ in range(3):
                x = torch.randn(n)
                torch.testing.assert_close(f(x)[0], x.cumsum(0))
    assert len(f.nodes) == 2 and len(tree.nodes) == 2
    assert f.stats.eager_calls == 3 + 3  # shapes 4 and 5, over the limit (no warm-up run counted for them)
    assert any("the limit" in r.getMessage() for r in caplog.records)


def test_static_input_moved_is_a_new_recording():
    w1, w2 = torch.randn(8, 8), torch.randn(8, 8)
    f, tree = graphed(mlp, [torch.randn(4, 8), w1], static=(1,))
    x = torch.randn(4, 8)
    for w in (w1, w1, w2, w2, w1, w2):
        torch.testing.assert_close(f(x, w)[0], mlp(x, w)[0])
    assert len(f.nodes) == 2


def test_python_values_are_part_of_the_key():
    f, _ = graphed(lambda x, k: (x * k,), [torch.randn(3), 2])
    x = torch.randn(3)
    for k in (2, 2, 2, 3, 3, 3):
        torch.testing.assert_close(f(x, k)[0], x * k)
    assert len(f.nodes) == 2


def test_static_buffer_mutated_once_per_call():
    cache = torch.zeros(6)

    def write(cache, pos, val):
        cache.index_copy_(0, pos, val)
        return (cache.sum().reshape(1),)

    f, _ = graphed(write, [cache, torch.tensor([0]), torch.ones(1)], static=(0,))
    for i in range(6):
        (s,) = f(cache, torch.tensor([i]), torch.tensor([float(i + 1)]))
        assert float(s) == sum(range(1, i + 2))
    torch.testing.assert_close(cache, torch.arange(1.0, 7.0))


def test_skip_mutated_non_static_input(caplog):
    def bump(x):
        x.add_(1)
        return (x * 2,)

    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        f, tree = graphed(bump, [torch.zeros(3)], graph_written_inputs=False)
        x = torch.zeros(3)
        for i in range(3):
            torch.testing.assert_close(f(x)[0], torch.full((3,), 2.0 * (i + 1)))
    assert f.skip_reason and "mutates input(s) [0]" in f.skip_reason
    assert not tree.nodes
    assert any("skipping CUDA graphs" in r.getMessage() for r in caplog.records)


def test_skip_sync_op():
    def sync(x):
        return (x * x.sum().item(),)

    f, tree = graphed(sync, [torch.ones(3)])
    for _ in range(3):
        torch.testing.assert_close(f(torch.ones(3))[0], torch.full((3,), 3.0))
    assert f.skip_reason and "synchronises" in f.skip_reason and "_local_scalar_dense" in f.skip_reason
    assert not tree.nodes


def test_skip_nonzero():
    f, _ = graphed(lambda x: (x.nonzero(),), [torch.ones(3)])
    f(torch.ones(3))
    assert f.skip_reason and "nonzero" in f.skip_reason


def test_skip_cpu_tensors_with_cuda_engine():
    f = cudagraphify(mlp, [torch.randn(2, 2), torch.randn(2, 2)], static_input_indices=(1,))
    assert f.skip_reason and "cpu" in f.skip_reason
    x, w = torch.randn(2, 2), torch.randn(2, 2)
    torch.testing.assert_close(f(x, w)[0], mlp(x, w)[0])


def test_skip_outputs_requiring_grad():
    w = torch.randn(3, requires_grad=True)
    f, _ = graphed(lambda x, w: (x * w,), [torch.randn(3), w], static=(1,))
    f(torch.randn(3), w)
    assert f.skip_reason and "require grad" in f.skip_reason


def test_capture_failure_skips():
    calls = {"n": 0}

    def flaky(x):
        calls["n"] += 1
        if calls["n"] == 2:  # fails while being recorded
            raise RuntimeError("boom")
        return (x + 1,)

    f, tree = graphed(flaky, [torch.zeros(2)])
    f(torch.zeros(2))
    out = f(torch.zeros(2))
    torch.testing.assert_close(out[0], torch.ones(2))
    assert f.skip_reason and "recording failed" in f.skip_reason and not tree.nodes


def test_single_tensor_and_list_results():
    f, _ = graphed(lambda x: x * 2, [torch.ones(2)])
    g, _ = graphed(lambda x: [x * 2, 3], [torch.ones(2)])
    for _ in range(3):
        assert isinstance(f(torch.ones(2)), torch.Tensor)
        r = g(torch.ones(2))
        assert isinstance(r, list) and r[1] == 3
        torch.testing.assert_close(r[0], torch.full((2,), 2.0))


def test_outputs_sharing_a_storage_relocate_together():
    def split(x):
        y = x * 2
        return (y[:2], y[2:])

    f, tree = graphed(split, [torch.arange(4.0)])
    f(torch.arange(4.0))
    a, b = f(torch.arange(4.0))
    assert len(tree.nodes[0].storages) == 1
    c, d = f(torch.arange(4.0) + 10)
    torch.testing.assert_close(torch.cat([a, b]), torch.arange(4.0) * 2)
    torch.testing.assert_close(torch.cat([c, d]), (torch.arange(4.0) + 10) * 2)


@pytest.mark.parametrize("limit", [1, 3])
def test_limit_counts_recordings_per_function(limit):
    f, _ = graphed(lambda x: (x + 1,), [torch.zeros(1)], max_recordings=limit)
    for n in range(1, 6):
        f(torch.zeros(n))
        f(torch.zeros(n))
    assert len(f.nodes) == limit


def test_training_step_forward_backward_one_tree():
    import gpu_modes_check as chk

    tree = make_tree()
    ref_w, ref_losses, _, _ = chk._train(None, device="cpu")
    got_w, got_losses, fw_g, bw_g = chk._train(tree, device="cpu")
    for a, b in zip(got_w, ref_w):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert fw_g.skip_reason is None and bw_g.skip_reason is None
    nf, nb = fw_g.nodes[0], bw_g.nodes[0]
    assert nb.parent is nf
    assert [s.borrowed.owner for s in nb.slots if s.borrowed is not None] == [nf.name]
    assert tree.stats.eager_fallbacks == 0, tree.as_text()


def test_skip_mutated_input_under_inference_mode():
    def bump(x):
        x.add_(1)  # inference tensors have no version counter: the dispatcher sees the write
        return (x * 2,)

    with torch.inference_mode():
        f, tree = graphed(bump, [torch.zeros(3)], graph_written_inputs=False)
        x = torch.zeros(3)
        for i in range(3):
            torch.testing.assert_close(f(x)[0], torch.full((3,), 2.0 * (i + 1)))
    assert f.skip_reason and "mutates input(s) [0]" in f.skip_reason and not tree.nodes


def test_out_variant_write_to_input_is_a_mutation():
    def write(x, y):
        torch.mul(y, 2, out=x)
        return (x + 1,)

    f, _ = graphed(write, [torch.zeros(3), torch.ones(3)], graph_written_inputs=False)
    f(torch.zeros(3), torch.ones(3))
    assert f.skip_reason and "mutates input(s) [0]" in f.skip_reason


def test_decode_loop_under_inference_mode():
    emb = torch.randn(16, 16) * 0.3
    with torch.inference_mode():
        f, tree = graphed(step, [torch.randn(1, 16), emb], static=(1,))
        tok = torch.randn(1, 16)
        ref, kept, refs = tok.clone(), [], []
        for _ in range(6):
            (tok,) = f(tok, emb)
            (ref,) = step(ref, emb)
            kept.append(tok)
            refs.append(ref)
    for got, want in zip(kept, refs):
        torch.testing.assert_close(got, want)
    assert f.skip_reason is None and f.stats.replays == 5


def test_tree_reset_starts_over():
    f, tree = graphed(lambda x: (x + 1,), [torch.zeros(2)])
    for _ in range(3):
        f(torch.zeros(2))
    old = tree.nodes[0]
    tree.reset()
    assert not tree.nodes
    for _ in range(3):
        torch.testing.assert_close(f(torch.ones(2))[0], torch.full((2,), 2.0))
    assert len(tree.nodes) == 1 and tree.nodes[0] is not old and f.nodes == tree.nodes


def test_forward_graph_handing_back_a_parameter_is_graphed():
    """A training forward graph returns the weights it saves for the backward: they require grad, but
    they are the caller's own tensors, so the graph is recorded (it was skipped as "returns tensors
    that require grad", which left every training forward of the suite without CUDA graphs)."""
    w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(x, w):
        with torch.no_grad():  # as inside autograd.Function.forward
            return ((x @ w).relu(), w)

    f, tree = graphed(forward, [torch.randn(4, 8), w], static=(1,))
    for _ in range(4):
        x = torch.randn(4, 8)
        out, saved = f(x, w)
        torch.testing.assert_close(out, (x @ w).relu().detach())
        torch.testing.assert_close(saved, w.detach())  # (the emulated capture runs on copies)
    assert f.skip_reason is None and f.stats.recordings == 1 and f.stats.replays == 3


def test_new_tensor_requiring_grad_still_skips():
    w = torch.nn.Parameter(torch.randn(8, 8))
    f, _ = graphed(lambda x, w: ((x @ w).relu(),), [torch.randn(4, 8), w], static=(1,))
    f(torch.randn(4, 8), w)
    assert f.skip_reason and "require grad" in f.skip_reason


def test_many_sizes_each_replay_their_own_recording():
    """A decode loop over a growing cache: every length seen before replays its recording (found by its
    input shapes, not by asking every node); warm-up counts are dropped once recorded and stop growing at
    the cap, where new sizes run without graphs."""
    f, tree = graphed(lambda x: (x.cumsum(0),), [torch.randn(1)], max_recordings=40)
    for _ in range(3):
        for n in range(1, 41):
            x = torch.randn(n)
            torch.testing.assert_close(f(x)[0], x.cumsum(0))
    assert (f.stats.warmups, f.stats.recordings, f.stats.replays, f.stats.eager_calls) == (40, 40, 80, 0)
    for n in range(41, 61):
        x = torch.randn(n)
        torch.testing.assert_close(f(x)[0], x.cumsum(0))
    assert (f.stats.recordings, f.stats.eager_calls) == (40, 20)
    assert f._warm == {}


def test_recording_stops_once_the_recordings_keep_their_share_of_the_device(caplog):
    """Each length of a growing cache keeps its outputs in the pool: past ``memory_fraction`` of the
    device's memory (4 KiB of 40 here; the emulated engine counts captured outputs as held), new lengths
    run without graphs, said once; lengths recorded before still replay. Fresh values every call."""
    tree = CUDAGraphTree("cpu", engine=EmulatedGraphEngine(total_bytes=40 * 1024), name="test")
    f, _ = graphed(lambda x: (x * 2,), [torch.zeros(1)], tree=tree, memory_fraction=0.1)
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for n in (256, 512, 768, 1024, 1280):  # 1, 2, 3 KiB of float32 outputs: 6 KiB kept after the third
            for _ in range(3):
                x = torch.randn(n)
                torch.testing.assert_close(f(x)[0], x * 2)
    assert (f.stats.recordings, tree.kept_bytes) == (3, 6 * 1024)
    assert f.stats.eager_calls == 6
    assert sum("CUDAGraphOptions.memory_fraction" in r.getMessage() for r in caplog.records) == 1
    replays = f.stats.replays
    x = torch.randn(512)
    torch.testing.assert_close(f(x)[0], x * 2)
    assert f.stats.replays == replays + 1


@pytest.mark.parametrize("inference", [False, True])
def test_input_written_in_place_is_graphed_at_its_own_address(inference, caplog):
    """A StaticCache-style update (the cache written at the step's position, a fresh position tensor
    every call): the input written in place is graphed at its own address, so every replay writes the
    caller's cache itself; the same cache replays, another cache (or another layout at that address)
    is a new signature, never a replay into the wrong memory."""
    def step(cache, pos, new):
        cache.index_copy_(0, pos, new)
        return (cache.sum(0),)

    ctx = torch.inference_mode() if inference else torch.no_grad()
    with ctx, caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        cache, want = torch.zeros(8, 4), torch.zeros(8, 4)
        f, tree = graphed(step, [cache, torch.tensor([0]), torch.randn(1, 4)])
        for i in range(8):
            pos, new = torch.tensor([i]), torch.randn(1, 4)
            want[i] = new[0]
            (out,) = f(cache, pos, new)
            torch.testing.assert_close(cache, want)  # the caller's tensor, not a copy
            torch.testing.assert_close(out, want.sum(0))
        assert f.skip_reason is None and f.written_in_place == {0}
        assert (f.stats.recordings, f.stats.eager_calls) == (1, 0) and f.stats.replays == 7 - 1
        other, other_want = torch.zeros(8, 4), torch.zeros(8, 4)
        for i in range(3):
            new = torch.randn(1, 4)
            other_want[i] = new[0]
            f(other, torch.tensor([i]), new)
        torch.testing.assert_close(other, other_want)
        torch.testing.assert_close(cache, want)  # untouched by the other cache's calls
        assert f.stats.recordings == 2
        flat = cache.view(32)[:16].view(4, 4)  # the same address, another layout
        (out,) = f(flat, torch.tensor([1]), torch.ones(1, 4))
        torch.testing.assert_close(flat[1], torch.ones(4))
        assert f.stats.recordings == 2  # a warm-up run of the new signature, not a replay of the old one
    assert any("written in place" in r.getMessage() for r in caplog.records)


def test_inputs_the_compiler_says_it_writes_are_graphed_in_place_unseen_by_the_warm_up():
    """A generated kernel writes an input's memory without an ATen op (no dispatcher event, no version
    bump: here a NumPy view stands in for it), which the warm-up cannot see. The inputs the compiled graph
    declares it writes (``written_inputs``: kiln.autograd's input mutations) are graphed at their own
    address from the start, so each replay writes the caller's tensor."""
    def bump(x, y):
        x.numpy()[:] += 1.0  # invisible to the warm-up's watcher
        return (x + y,)

    y = torch.ones(3)
    x = torch.zeros(3)
    f, tree = graphed(bump, [x, y], written_inputs=[0])
    for i in range(1, 5):
        (out,) = f(x, y)
        torch.testing.assert_close(x, torch.full((3,), float(i)))  # the caller's tensor, every call
        torch.testing.assert_close(out, torch.full((3,), i + 1.0))
    assert f.written_in_place == {0} and f.stats.recordings == 1 and f.stats.replays >= 2
