"""``torch.utils.checkpoint.checkpoint`` inside compiled code: one graph (it used to break the graph at
every call), eager's values and gradients, and the recompute eager's checkpoint promises: the partition
saves the region's inputs, not the activations inside it; random draws inside are saved, never drawn again.
Every program runs several times with fresh inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import kiln
import kiln.capture as kc
from kiln.autograd import partition, trace_joint


class Mlp(nn.Module):
    def __init__(self, ck: bool) -> None:
        super().__init__()
        self.ck = ck
        self.ff = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(32, 32), nn.GELU())])
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.ff, x, use_reentrant=False) if self.ck else self.ff(x)
        return self.head(h).sum()


def _partition(ck: bool):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Mlp(ck)
    parts = []

    def backend(gm, example_inputs):  # kiln.autograd's joint trace and min-cut of the captured graph
        parts.append(partition(trace_joint(gm, example_inputs), "min_cut"))
        return gm.forward
    kc.optimize(model, backend)(torch.randn(64, 32, requires_grad=True))
    assert len(parts) == 1
    return parts[0]


def test_checkpointed_activations_are_recomputed_not_saved() -> None:
    plain, checkpointed = _partition(False), _partition(True)
    activation = 64 * 32 * 4
    assert checkpointed.saved_bytes <= plain.saved_bytes - 2 * activation, (checkpointed.saved, plain.saved)
    # inside the region nothing is saved: the backward starts from the input and the weights
    assert all(name.startswith("primals") for name in checkpointed.saved), checkpointed.saved
    assert not all(name.startswith("primals") for name in plain.saved), plain.saved


def test_checkpoint_compiles_to_one_graph_with_eager_gradients() -> None:
    torch.manual_seed(0)
    model, eager = Mlp(True), Mlp(True)
    eager.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    kiln.reset()
    before = kiln.stats()
    for n in (16, 16, 16):
        x = torch.randn(n, 32, requires_grad=True)
        got = compiled(x)
        got.backward()
        gx = x.grad
        x.grad = None
        want = eager(x)
        want.backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(gx, x.grad)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad, q.grad = None, None
    after = kiln.stats()
    assert after.graph_breaks == before.graph_breaks
    assert after.frames_run_eagerly == before.frames_run_eagerly


def test_dropout_inside_a_checkpoint_is_not_drawn_again() -> None:
    """A recomputed dropout would draw a new mask in the backward: the gradient would not match the
    forward's mask. The region's random draw is saved instead."""
    w = torch.randn(32, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda t: F.dropout(t * w, 0.5, training=True).exp(), x, use_reentrant=False)
    compiled = kiln.compile(f)
    for _ in range(3):
        x = torch.randn(64, 32)
        y = compiled(x)
        y.sum().backward()
        kept = (y != 1.0).float()  # exp(0) = 1 where dropped (x * w is never exactly 0 here)
        torch.testing.assert_close(w.grad, (x * kept * 2 * y).sum(0))
        w.grad = None


def test_reentrant_checkpoint_without_grad_inputs_runs_as_eager() -> None:
    """Eager's reentrant checkpoint gives parameters inside no gradient when no argument needs grad:
    that call breaks the graph and runs in Python, so the compiled program does the same."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lin, x, use_reentrant=True).sum()
    compiled = kiln.compile(f)
    for _ in range(2):
        out = compiled(torch.randn(4, 8))
        if out.requires_grad:
            out.backward()
        assert lin.weight.grad is None


class _NormBlock(nn.Module):
    """A checkpointed region updating BatchNorm's running statistics (through the module, which also
    adds to ``num_batches_tracked``, or ``F.batch_norm`` alone) and a buffer of its own."""

    def __init__(self, how: str, reentrant: bool) -> None:
        super().__init__()
        self.how, self.reentrant = how, reentrant
        self.lin, self.bn, self.head = nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def region(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.how == "module":
            h = self.bn(h)
        elif self.how == "functional":
            h = F.batch_norm(h, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                             training=True, momentum=0.2)
        else:
            self.calls.add_(1)
        return torch.relu(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.region, x, use_reentrant=self.reentrant)).sum()


def _step_like_eager(compiled: nn.Module, model: nn.Module, eager: nn.Module, x: torch.Tensor) -> None:
    """One forward and backward of the compiled model and of eager's copy: outputs, the input's gradient
    and every parameter's gradient equal."""
    got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want)
    got.backward()
    gx, x.grad = x.grad, None
    want.backward()
    torch.testing.assert_close(gx, x.grad)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_checkpointed_writes_to_buffers_repeat_as_eager() -> None:
    """Eager's checkpoint runs the region again in the backward, and its in-place writes to tensors
    from outside the region with it: BatchNorm's running statistics are updated twice per step. Traced
    inline, the writes happened once (and BatchNorm's made the partitioner fail); now such a region breaks
    the graph and the checkpoint runs in Python, its function compiled, as eager."""
    for how in ("module", "functional", "buffer"):
        for reentrant in (False, True):
            torch.manual_seed(0)
            model, eager = _NormBlock(how, reentrant), _NormBlock(how, reentrant)
            eager.load_state_dict(model.state_dict())
            compiled = kiln.compile(model, backend="aot_eager")
            for n in (4, 4, 6):
                _step_like_eager(compiled, model, eager, torch.randn(n, 8, requires_grad=True))
                for (name, b), c in zip(model.named_buffers(), eager.buffers()):
                    torch.testing.assert_close(b, c, msg=f"{how} reentrant={reentrant}: {name}")


class _MultiOutputRegion(nn.Module):
    """Ops with several results inside the region: LayerNorm, ``var_mean``, ``max`` with indices and an
    eval-mode BatchNorm (which writes nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.ln, self.bn = nn.Linear(6, 6), nn.LayerNorm(6), nn.BatchNorm1d(6)

    def region(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.lin(x))
        var, mean = torch.var_mean(h, dim=0)
        top, _ = h.max(dim=1, keepdim=True)
        return self.bn((h - mean) / (var + 1).sqrt() + top).tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.region, x, use_reentrant=False).pow(2).sum()


def test_multi_output_ops_inside_a_checkpoint() -> None:
    """A multi-output op in the region (eval-mode BatchNorm's is banned from recomputation elsewhere) left
    its result recomputable but the op itself not: the partitioner found no cut and raised."""
    for backend in ("aot_eager", "inductor"):
        torch.manual_seed(0)
        model, eager = _MultiOutputRegion().eval(), _MultiOutputRegion().eval()
        eager.load_state_dict(model.state_dict())
        compiled = kiln.compile(model, backend=backend)
        for n in (5, 5, 7):
            _step_like_eager(compiled, model, eager, torch.randn(n, 6, requires_grad=True))
            for p, q in zip(model.parameters(), eager.parameters()):
                p.grad, q.grad = None, None
