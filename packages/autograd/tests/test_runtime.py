"""The run-time wrapper: optimizer steps, autocast, frozen parameters, non-differentiable outputs,
double backward, inference graphs and user autograd.Functions."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from ag_util import check, compile_fn, compile_module  # type: ignore[import-not-found]
from torch import fx, nn

from kiln.autograd import DoubleBackwardError, aot, aot_eager, run_graph_compiler, trace_inference


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.ln = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.ln(self.fc1(x))))


def _train(model: nn.Module, fn, steps: int = 3, opt_cls=torch.optim.Adam):  # type: ignore[no-untyped-def]
    opt = opt_cls([p for p in model.parameters() if p.requires_grad], lr=0.01)
    losses = []
    for i in range(steps):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(i))
        loss = fn(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_optimizer_steps_symbolic_trace(opt_cls) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    eager = MLP()
    comp = copy.deepcopy(eager)
    gm = fx.symbolic_trace(comp)  # parameters stay get_attr: kiln lifts them to inputs
    compiled = aot_eager(gm, [torch.randn(6, 8)])

    def run(x):  # type: ignore[no-untyped-def]
        return compiled(x)
    le = _train(eager, eager, opt_cls=opt_cls)
    lc = _train(gm, run, opt_cls=opt_cls)
    torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
    got = dict(gm.named_parameters())
    for name, pe in eager.named_parameters():
        torch.testing.assert_close(got[name], pe, rtol=1e-4, atol=1e-5)


def test_optimizer_steps_torch_compile() -> None:
    torch.manual_seed(0)
    eager = MLP()
    comp = copy.deepcopy(eager)
    compiled, graphs = compile_module(comp)
    le = _train(eager, eager)
    lc = _train(comp, compiled)
    torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
    assert len(graphs) == 1


def test_frozen_parameters_get_no_grad() -> None:
    torch.manual_seed(0)
    m = MLP()
    m.fc1.weight.requires_grad_(False)
    gm = fx.symbolic_trace(m)
    c = aot_eager(gm, [torch.randn(6, 8)])
    c(torch.randn(6, 8)).sum().backward()
    assert gm.fc1.weight.grad is None and gm.fc1.bias.grad is not None
    sig = c.aot.joint.signature
    assert len(sig.grad_inputs) == sum(p.requires_grad for p in gm.parameters())


def test_all_frozen_is_inference_graph() -> None:
    m = MLP().requires_grad_(False)
    c = aot_eager(fx.symbolic_trace(m), [torch.randn(6, 8)])
    assert c.aot.partitioned is None and not c.aot.joint.joint
    torch.testing.assert_close(c(torch.ones(6, 8)), m(torch.ones(6, 8)))


def test_no_grad_mode_gives_inference_graph() -> None:
    m = MLP()
    with torch.no_grad():
        c = aot_eager(fx.symbolic_trace(m), [torch.randn(6, 8)])
        out = c(torch.ones(6, 8))
    assert c.aot.partitioned is None
    assert not out.requires_grad
    torch.testing.assert_close(out, m(torch.ones(6, 8)))


def test_inference_compiler_is_used() -> None:
    calls = []

    def inf(gm, ex):  # type: ignore[no-untyped-def]
        calls.append("inference")
        return gm

    def fw(gm, ex):  # type: ignore[no-untyped-def]
        calls.append("fw")
        return gm
    with torch.no_grad():
        aot(fx.symbolic_trace(lambda x: (x + 1,)), [torch.randn(3)], fw_compiler=fw, inference_compiler=inf)
    assert calls == ["inference"]


def test_compilers_receive_fake_inputs_and_aten_graphs() -> None:
    seen = []

    def comp(gm, ex):  # type: ignore[no-untyped-def]
        seen.append((gm, ex))
        return gm
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    aot(fx.symbolic_trace(lambda x, w: ((x @ w).relu().sum(),)), [x, w], fw_compiler=comp)
    assert len(seen) == 2  # forward and backward (bw_compiler defaults to fw_compiler)
    for gm, ex in seen:
        assert all(n.op != "call_function" or str(n.target).startswith(("aten.", "<built-in"))
                   for n in gm.graph.nodes)
        assert all(type(t).__name__ == "FakeTensor" for t in ex if isinstance(t, torch.Tensor))


def test_outputs_not_requiring_grad() -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    c = compile_fn(lambda x, w: ((x * w).sum(), x.argmax(), (x + 1)), [x, w])
    s, idx, y = c(x, w)
    assert s.requires_grad and not idx.requires_grad and not y.requires_grad
    s.backward()
    torch.testing.assert_close(w.grad, x)


def test_unused_output_gets_zero_tangent() -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    c = compile_fn(lambda x, w: ((x * w).sum(), (x * w * 3).sum()), [x, w])
    a, _ = c(x, w)
    a.backward()
    torch.testing.assert_close(w.grad, x)


def test_double_backward_raises_clear_error() -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    c = compile_fn(lambda x, w: ((x * w).pow(2).sum(),), [x, w])
    (y,) = c(x, w)
    # create_graph=True still gives the first-order gradient (as torch.compile does) ...
    (g,) = torch.autograd.grad(y, w, create_graph=True)
    torch.testing.assert_close(g, 2 * x * x * w)
    assert g.requires_grad
    # ... but differentiating it again (a gradient penalty) raises, naming the problem
    with pytest.raises(DoubleBackwardError, match="double backward"):
        (y + g.pow(2).sum()).backward()


def test_create_graph_gradient_passing_a_tangent_through() -> None:
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    c = compile_fn(lambda x, w: (x + w,), [x, w])
    (y,) = c(x, w)
    t = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(y, w, t, create_graph=True)
    torch.testing.assert_close(g, t)
    with pytest.raises(DoubleBackwardError):
        g.sum().backward()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cpu(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    eager = MLP()
    comp = copy.deepcopy(eager)
    compiled, _ = compile_module(comp)
    x = torch.randn(6, 8)
    with torch.autocast("cpu", dtype=dtype):
        oe = eager(x)
        oc = compiled(x)
    assert oc.dtype == oe.dtype == dtype
    oe.float().sum().backward()
    oc.float().sum().backward()
    torch.testing.assert_close(oc, oe, rtol=1e-2, atol=1e-2)
    for pe, pc in zip(eager.parameters(), comp.parameters()):
        assert pc.grad.dtype == pe.grad.dtype
        torch.testing.assert_close(pc.grad, pe.grad, rtol=2e-2, atol=2e-2)


def test_autocast_inside_graph() -> None:
    def f(x, w):  # type: ignore[no-untyped-def]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y.float().sum()
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(f, backend=aot_eager, dynamic=False)(x, w)
    out.backward()
    w2 = w.detach().clone().requires_grad_()
    f(x, w2).backward()
    torch.testing.assert_close(w.grad, w2.grad)


class ScaledSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return g * 3 * x.cos()  # deliberately not the true derivative: proves the custom backward ran


@fx.wrap
def scaled_sin(x):  # type: ignore[no-untyped-def]
    return ScaledSin.apply(x)


def test_user_autograd_function_symbolic_trace() -> None:
    x = torch.randn(5, requires_grad=True)
    check(lambda x: (scaled_sin(x * 2).sum(),), [x])


def test_user_autograd_function_torch_compile() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return ScaledSin.apply(x * 2).sum()
    x = torch.randn(5, requires_grad=True)
    torch._dynamo.reset()
    torch.compile(f, backend=aot_eager, dynamic=False)(x).backward()
    x2 = x.detach().clone().requires_grad_()
    f(x2).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(x.grad, 6 * torch.cos(2 * x.detach()))


def test_trace_inference_standalone() -> None:
    g = trace_inference(fx.symbolic_trace(lambda x: (torch.relu(x).sum(0),)), [torch.randn(3, 4)])
    assert "aten.relu.default" in g.as_text() and not g.joint


def test_fake_example_inputs_run_nothing_real() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    with mode:
        fx_ = torch.empty(4, 4)
        fw_ = torch.empty(4, 4).requires_grad_()
    c = aot_eager(fx.symbolic_trace(lambda x, w: ((x @ w).sum(),)), [fx_, fw_])
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    (y,) = c(x, w)
    y.backward()
    torch.testing.assert_close(w.grad, x.t() @ torch.ones(4, 4))


def test_run_graph_compiler_has_portable() -> None:
    gm = fx.symbolic_trace(lambda x: (x + 1,))
    assert run_graph_compiler(gm, [torch.randn(2)]).portable is not None


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class _BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1) for _ in range(3))
        self.bns = nn.ModuleList(nn.BatchNorm2d(4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for c, b in zip(self.convs, self.bns):
            x = F.relu(b(c(x)))
        return x, x.mean()  # the second output is left out of the loss


def test_mutated_buffers_written_back_at_once_and_no_zero_grads_for_them() -> None:
    """BatchNorm running statistics (9 mutated buffers) are written back by one multi-tensor copy,
    and backward allocates no zero gradients for them; results and buffers match eager."""
    torch.manual_seed(0)
    eager = _BNNet()
    comp = copy.deepcopy(eager)
    x = torch.randn(2, 4, 6, 6)
    run = aot_eager(fx.symbolic_trace(comp), [x])
    out_e = eager(x)[0]
    out_e.sum().backward()
    counter = _OpCounter()
    with counter:
        out_c = run(x)[0]
    assert counter.ops.get("_foreach_copy_", 0) == 1 and counter.ops.get("copy_", 0) == 0, counter.ops
    backward_ops = _OpCounter()
    with backward_ops:
        out_c.sum().backward()
    assert backward_ops.ops.get("zeros", 0) + backward_ops.ops.get("zero_", 0) + backward_ops.ops.get("fill_", 0) <= 1, \
        backward_ops.ops  # at most the unused mean output's tangent
    torch.testing.assert_close(out_c, out_e)
    for (n, a), b in zip(eager.named_buffers(), comp.buffers()):
        torch.testing.assert_close(b, a, msg=n)
    for (n, a), b in zip(eager.named_parameters(), comp.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=n)
