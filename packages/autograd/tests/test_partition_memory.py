"""What the min-cut saves under AMP: parameters (held by the module anyway) rather than their bf16
casts, which the backward recomputes; gradients unchanged."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ag_util import compile_fn  # type: ignore[import-not-found]

from kiln.autograd import partition, trace_joint

aten = torch.ops.aten


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor]:
    return ((F.linear(torch.relu(F.linear(x, w1)), w2)).float().square().mean(),)


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 32, generator=g), torch.randn(64, 32, generator=g).requires_grad_(),
            torch.randn(16, 64, generator=g).requires_grad_()]


def test_amp_saves_weights_not_their_casts() -> None:
    from torch import fx
    inputs = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        joint = trace_joint(fx.symbolic_trace(_mlp), inputs)
    parts = partition(joint, "min_cut")
    out = next(n for n in parts.fw_gm.graph.nodes if n.op == "output").args[0]
    saved = out[len(out) - parts.n_saved:]
    casts_of_weights = [n for n in saved if n.target is aten._to_copy.default
                        and n.args[0].op == "placeholder" and n.args[0].meta["val"].requires_grad]
    assert not casts_of_weights, parts.as_text()
    assert sum(n.op == "placeholder" for n in saved) == 1  # w2 (for relu(x @ w1)'s gradient), for free
    # the backward recomputes the bf16 casts it needs
    assert any(n.target is aten._to_copy.default for n in parts.bw_gm.graph.nodes)


def test_amp_gradients_unchanged() -> None:
    inputs = _inputs()
    e_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _mlp(*e_in)[0].backward()
        compiled = compile_fn(_mlp, inputs)
        (loss,) = compiled(*inputs)
    loss.backward()
    for a, b in zip(inputs[1:], e_in[1:]):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-2, rtol=1e-2)


def _conv_bn_net() -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))


def _saved_targets(recompute: bool) -> tuple[list, int]:
    from torch import fx

    from kiln.autograd import AotOptions
    from kiln.autograd.pipeline import run_aot_pipeline
    x = torch.randn(4, 3, 16, 16)
    _, parts = run_aot_pipeline(fx.symbolic_trace(_conv_bn_net()), [x], AotOptions(recompute_norms=recompute))
    assert parts is not None
    out = next(n for n in parts.fw_gm.graph.nodes if n.op == "output").args[0]
    return [n.target for n in out[len(out) - parts.n_saved:]], parts.saved_bytes


def test_batch_norm_relu_outputs_are_recomputed_not_saved() -> None:
    before, before_bytes = _saved_targets(False)
    after, after_bytes = _saved_targets(True)
    assert aten.relu.default in before  # the ReLU outputs after BatchNorm were saved
    assert aten.relu.default not in after
    assert after_bytes < before_bytes * 0.75, (after_bytes, before_bytes)


def test_batch_norm_rewrite_gradients_and_running_stats_equal_eager() -> None:
    import copy

    from torch import fx

    from kiln.autograd import aot, run_graph_compiler
    eager = _conv_bn_net().double()
    model = copy.deepcopy(eager)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    eager(x).square().mean().backward()
    compiled = aot(fx.symbolic_trace(model), [x], fw_compiler=run_graph_compiler, recompute_norms=True)
    assert any(n.target is aten.sub.Tensor for n in compiled.aot.partitioned.bw_gm.graph.nodes)
    out = compiled(x)
    (out[0] if isinstance(out, (tuple, list)) else out).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, msg=name)


def test_max_pool_backward_is_sized_by_a_saved_tensor_not_a_recomputed_one() -> None:
    """ATen's max-pool backward reads its input argument for its sizes and layout only: the backward
    takes the convolution output BatchNorm's backward saves anyway, instead of rebuilding
    relu(batch_norm(conv)) over the whole activation just to pass it (recompute.shape_only_arguments)."""
    from torch import fx

    from kiln.autograd import AotOptions
    from kiln.autograd.pipeline import run_aot_pipeline
    x = torch.randn(4, 3, 16, 16)
    _, parts = run_aot_pipeline(fx.symbolic_trace(_conv_bn_net()), [x], AotOptions())
    assert parts is not None
    pool = next(n for n in parts.bw_gm.graph.nodes if n.target is aten.max_pool2d_with_indices_backward.default)
    assert pool.args[1].op == "placeholder", parts.bw_gm.code
