"""PoolStorage: counting references to a graph output's storage, relocating what kiln handed out."""

from __future__ import annotations

import torch

from kiln.inductor.cudagraphs import LivenessStats, PoolStorage


def make():
    static = torch.arange(6.0)
    ps = PoolStorage(static, "node#0", LivenessStats())
    ps.seal()
    return static, ps


def test_nothing_handed_out_is_free():
    _, ps = make()
    assert not ps.is_referenced() and ps.release()


def test_dropped_outputs_need_no_copy():
    static, ps = make()
    out = ps.hand_out(static)
    assert ps.is_referenced()
    del out
    assert ps.release() and ps.stats.relocations == 0


def test_held_output_is_relocated_with_value_and_identity():
    static, ps = make()
    held = ps.hand_out(static)
    ident = id(held)
    assert ps.release()
    static.fill_(-1)  # the next replay overwrites the graph's memory
    assert id(held) == ident and torch.equal(held, torch.arange(6.0))
    assert ps.stats.relocations == 1 and ps.stats.relocated_bytes == 24
    assert not ps.is_referenced()


def test_a_view_the_user_made_cannot_be_moved():
    static, ps = make()
    view = ps.hand_out(static)[2:]
    assert not ps.release() and ps.stats.blocked == 1
    del view
    assert ps.release()


def test_relocation_keeps_autograd_history():
    static, ps = make()
    held = ps.hand_out(static)
    w = torch.ones(6, requires_grad=True)
    y = held * w  # autograd saves `held` itself for w's gradient
    assert ps.release()  # ... so re-pointing `held` moves autograd's reference too
    static.data.fill_(0)  # a replay overwrites memory without touching version counters
    y.sum().backward()
    assert torch.equal(w.grad, torch.arange(6.0))


def test_copy_out_mode_hands_out_private_copies():
    static, ps = make()
    ps.copy_out = True
    out = ps.hand_out(static)
    assert out.data_ptr() != static.data_ptr() and not ps.is_referenced()
    assert ps.stats.copied_outputs == 1


def test_relocation_copies_only_what_the_outputs_reach():
    # a storage that is a whole arena, of which the outputs are a small part (scheduler/arena.py)
    arena = torch.arange(1000.0)
    outs = [arena[600:610], arena[700:704].view(2, 2)]
    ps = PoolStorage(arena, "node#0", LivenessStats())
    ps.keep(arena)
    ps.seal()
    held = [ps.hand_out(o) for o in outs]
    assert ps.release()
    arena.fill_(-1)
    assert torch.equal(held[0], torch.arange(600.0, 610.0))
    assert torch.equal(held[1], torch.arange(700.0, 704.0).view(2, 2))
    assert ps.stats.relocated_bytes == (704 - 600) * 4  # not the arena's 4,000 bytes
    assert held[0].untyped_storage().data_ptr() == held[1].untyped_storage().data_ptr()
