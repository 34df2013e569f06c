"""Donation on CPU: a backward recorded with its saved activations handed over may reuse their memory.

``ClobberingEngine`` emulates what the allocator allows once a storage is donated: every replay of a graph
recorded at or after the donation may overwrite it (here: fills it with NaN after the replay). Results must
still equal eager's: for the saved activations the backward consumes, for an activation the caller keeps,
and for ``retain_graph`` (autograd keeps the saved tensors, so they are not the backward's to overwrite).
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.wrapper import release_saved
from kiln.inductor.cudagraphs import (
    CUDAGraphOptions,
    CUDAGraphTree,
    EmulatedGraphEngine,
    cudagraphify,
    liveness,
)


class ClobberingEngine(EmulatedGraphEngine):
    donates = liveness.CAN_DONATE

    def __init__(self) -> None:
        super().__init__()
        self.tree: CUDAGraphTree | None = None
        self.order: dict[int, int] = {}  # id(graph) -> its recording order

    def capture(self, fn, args, *, pool, device, capture_error_mode, owned=False, expandable=False):
        self.expandable_captures = getattr(self, "expandable_captures", 0) + expandable
        graph, outputs = super().capture(fn, list(args), pool=pool, device=device,
                                         capture_error_mode=capture_error_mode)
        self.order[id(graph)] = len(self.order)
        if owned:
            args.clear()  # call_owned empties the list it is handed
        return graph, outputs

    def replay(self, graph):
        super().replay(graph)
        assert self.tree is not None
        for ps in self.tree._donated:  # noqa: SLF001 - the emulation needs the tree's donation list
            if ps.donated_at is not None and ps.donated_at <= self.order[id(graph)]:
                ps._bytes.view(torch.float64).fill_(float("nan"))  # noqa: SLF001


class Owned:
    """A compiled graph with ``call_owned`` (drops each input it was handed, as kiln's wrappers do)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def call_owned(self, args):
        try:
            return self.fn(*args)
        finally:
            args.clear()


def fw(x, w1, w2):
    h1 = torch.tanh(x @ w1)
    h2 = torch.tanh(h1 @ w2)
    return h2.sum(1), h1, h1, h2  # user outputs: out, h1; saved: h1, h2


def bw(h1, h2, w1, w2, x, g):
    gh2 = g[:, None] * (1 - h2 * h2)
    gw2 = h1.t() @ gh2
    gh1 = (gh2 @ w2.t()) * (1 - h1 * h1)
    return x.t() @ gh1, gw2


def make_step(tree, options):
    ex_x, ex_w1, ex_w2 = torch.randn(16, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64), \
        torch.randn(8, 8, dtype=torch.float64)
    fw_g = cudagraphify(Owned(fw), [ex_x, ex_w1, ex_w2], static_input_indices=(1, 2), tree=tree,
                        options=options, name="fw")
    h = torch.randn(16, 8, dtype=torch.float64)
    bw_g = cudagraphify(Owned(bw), [h, h, ex_w1, ex_w2, ex_x, torch.randn(16, dtype=torch.float64)],
                        static_input_indices=(2, 3), tree=tree, options=options, name="bw")

    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w1, w2):
            out, h1, s1, s2 = fw_g(x, w1, w2)
            ctx.save_for_backward(s1, s2, w1, w2, x)
            ctx.mark_non_differentiable(h1)
            return out, h1

        @staticmethod
        def backward(ctx, g, _gh1):
            args = [*ctx.saved_tensors, g.contiguous()]
            gw1, gw2 = bw_g.call_owned(args) if release_saved(ctx) else bw_g(*args)
            return None, gw1, gw2

    return Step, fw_g, bw_g


def run_steps(step_apply, w1, w2, xs, retain_from):
    grads, kept = [], []
    for i, x in enumerate(xs):
        w1.grad = w2.grad = None
        out, h1 = step_apply(x, w1, w2)
        loss = out.square().sum()
        if i >= retain_from:
            loss.backward(retain_graph=True)
        loss.backward()
        kept.append(h1)
        grads.append((w1.grad.clone(), w2.grad.clone()))
    return grads, kept


def eager_step(x, w1, w2):
    out, h1, _, _ = fw(x, w1, w2)
    return out, h1.detach()


def graphed_vs_eager(options, steps, retain_from):
    """Eager and graphed runs of the same steps: (grads, kept, ref_grads, ref_kept, tree, fw_g, bw_g)."""
    torch.manual_seed(0)
    w1 = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    xs = [torch.randn(16, 8, dtype=torch.float64) for _ in range(steps)]
    ref_grads, ref_kept = run_steps(eager_step, w1, w2, xs, retain_from=retain_from)
    engine = ClobberingEngine()
    tree = CUDAGraphTree("cpu", engine=engine, name="donation")
    engine.tree = tree
    step, fw_g, bw_g = make_step(tree, options)
    grads, kept = run_steps(step.apply, w1, w2, xs, retain_from=retain_from)
    for (g1, g2), (r1, r2) in zip(grads, ref_grads):
        torch.testing.assert_close(g1, r1)
        torch.testing.assert_close(g2, r2)
    return kept, ref_kept, tree, fw_g, bw_g


def test_backward_reuses_saved_activations_and_results_stay_eager():
    kept, ref_kept, tree, fw_g, bw_g = graphed_vs_eager(CUDAGraphOptions(), steps=6, retain_from=4)
    for k, r in zip(kept, ref_kept):  # h1 is returned to the caller too: never donated, never clobbered
        torch.testing.assert_close(k, r)
    if not liveness.CAN_DONATE:
        return
    assert bw_g.stats.recordings == 1 and bw_g.stats.replays >= 4, (bw_g.stats, bw_g.skip_reason, fw_g.skip_reason)
    assert tree.liveness.donated == 1, tree.as_text()  # h2 only: h1's storage is also the caller's output
    # a training tree: forward and backward recordings allocate in expandable segments (engine.py)
    assert tree.trains and tree.engine.expandable_captures == 2, tree.engine.expandable_captures
    donated = tree._donated[0]  # noqa: SLF001
    assert donated.owner == fw_g.nodes[0].name and donated.donated_at == bw_g.nodes[0].order
    # (the backward's second call of a retain_graph step runs once without its graph: the first one's
    # gradients live on in .grad through an alias autograd made, which kiln cannot move)
    assert fw_g.stats.eager_calls == 0 and bw_g.stats.eager_calls <= 1, (fw_g.stats, bw_g.stats)
    # retain_graph: autograd still held h2, so the first backward of those steps moved it out of the way
    assert tree.liveness.relocations >= 2


def test_no_donation_when_switched_off():
    _, _, tree, _, _ = graphed_vs_eager(CUDAGraphOptions(donate_saved=False), steps=4, retain_from=9)
    assert tree.liveness.donated == 0


def test_saved_parameters_are_static_in_the_backward():
    """The backward receives the weights the forward saved: it reads them in place like the forward
    (no slot, no copy per replay) although its own static indices do not name them."""
    options = CUDAGraphOptions()
    torch.manual_seed(0)
    tree = CUDAGraphTree("cpu", engine=ClobberingEngine(), name="statics")
    tree.engine.tree = tree
    ex_x, ex_w = torch.randn(16, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64)
    bw_plain = cudagraphify(Owned(bw), [ex_x, ex_x, ex_w, ex_w, ex_x, torch.randn(16, dtype=torch.float64)],
                            tree=tree, options=options, name="bw_plain")
    fw_g = cudagraphify(Owned(fw), [ex_x, ex_w, ex_w], static_input_indices=(1, 2), tree=tree,
                        options=options, name="fw2")
    w1 = torch.randn(8, 8, dtype=torch.float64)
    w2 = torch.randn(8, 8, dtype=torch.float64)
    for _ in range(4):
        x = torch.randn(16, 8, dtype=torch.float64)
        out, h1, s1, s2 = fw_g(x, w1, w2)
        g = torch.randn(16, dtype=torch.float64)
        got = bw_plain(s1.clone(), s2.clone(), w1, w2, x, g)
        ref = bw(s1, s2, w1, w2, x, g)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b)
        w1.add_(0.01)  # an optimizer step: in place, the graph reads the new values
    assert bw_plain.static_input_indices == {2, 3}, bw_plain.static_input_indices
    node = bw_plain.nodes[0]
    assert {s.index for s in node.slots} == {0, 1, 4, 5}, node.describe()
    assert bw_plain.stats.recordings == 1 and bw_plain.stats.replays == 3, bw_plain.stats


def test_donated_view_output_does_not_pin_its_memory():
    """An output that is a view (an mm result reshaped) keeps its base alive through ``_base``: once donated,
    the recording must be able to free the memory when the caller's tensors go (Llama: 770 MB stayed)."""
    if not liveness.CAN_DONATE:
        return
    from kiln.inductor.cudagraphs.node import GraphNode

    node = GraphNode.plan_inputs("fw#0", 0, None, [], [], lambda t: None)
    out = torch.randn(16, 8).view(8, 16)
    node.plan_outputs((out,), [], liveness.LivenessStats())
    del out
    (ps,) = node.storages
    ps.seal()
    watched = StorageWeakRef(ps.donate(1))
    assert watched.expired(), "a kept view's base still owns the donated storage"
