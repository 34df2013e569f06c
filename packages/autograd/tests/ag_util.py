"""Shared helpers: compile a function or module with kiln.autograd and compare with eager."""

from __future__ import annotations

import os

os.environ.setdefault("KILN_VERIFY", "1")  # before kiln.graph reads its knobs

import copy  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import fx  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from kiln.autograd import aot_eager  # noqa: E402


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            y.requires_grad_(x.requires_grad)
            out.append(y)
        else:
            out.append(x)
    return out


def _loss(outs: Any) -> torch.Tensor | None:
    flat = [o for o in tree_flatten(outs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not flat:
        return None
    total = None
    for i, o in enumerate(flat):
        g = torch.Generator().manual_seed(100 + i)
        # weights drawn on the CPU (same values on every device), then moved to the output's device
        w = torch.randn(o.shape, generator=g, dtype=torch.float32).to(device=o.device, dtype=o.dtype)
        term = (o * w).sum()
        total = term if total is None else total + term
    return total


def assert_close(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5, what: str = "") -> None:
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    assert len(fa) == len(fb), f"{what}: {len(fa)} vs {len(fb)} values"
    for i, (x, y) in enumerate(zip(fa, fb)):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), f"{what}[{i}]"
            assert x.shape == y.shape and x.dtype == y.dtype, f"{what}[{i}]: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
            torch.testing.assert_close(x.detach(), y.detach(), rtol=rtol, atol=atol, msg=f"{what}[{i}] differs")
        else:
            assert x == y, f"{what}[{i}]: {x} vs {y}"


def compile_fn(fn: Callable[..., Any], inputs: Sequence[Any], **kw: Any) -> Any:
    gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
    return aot_eager(gm, inputs, **kw)


def check(fn: Callable[..., Any], inputs: Sequence[Any], *, partitioner: str = "min_cut",
          no_grad: bool = False, rtol: float = 1e-4, atol: float = 1e-5) -> Any:
    """Run ``fn`` eagerly and compiled (symbolic_trace + aot_eager) on equal inputs; compare outputs,
    mutated inputs and gradients of every input that requires grad. Returns the compiled graph."""
    e_in, c_in = clone_inputs(inputs), clone_inputs(inputs)
    ctx = torch.no_grad() if no_grad else torch.enable_grad()
    try:
        with ctx:
            e_out = fn(*e_in)
        e_loss = _loss(e_out)
        if e_loss is not None:
            e_loss.backward()
    except Exception as e:  # eager refuses the program: the compiled one must refuse it too
        with pytest.raises(Exception):  # noqa: B017 - whatever eager raised
            with ctx:
                compiled = compile_fn(fn, c_in, partitioner=partitioner)
                c_out = compiled(*c_in)
            loss = _loss(c_out)
            if loss is not None:
                loss.backward()
        return e
    with ctx:
        compiled = compile_fn(fn, clone_inputs(inputs), partitioner=partitioner)
        c_out = compiled(*c_in)
    assert_close(c_out, e_out, rtol, atol, "outputs")
    c_loss = _loss(c_out)
    assert (c_loss is None) == (e_loss is None)
    if c_loss is not None:
        c_loss.backward()
    assert_close(c_in, e_in, rtol, atol, "inputs after the call")
    for i, (c, e) in enumerate(zip(c_in, e_in)):
        if isinstance(e, torch.Tensor) and e.requires_grad:
            assert (c.grad is None) == (e.grad is None), f"grad of input {i}"
            if e.grad is not None:
                torch.testing.assert_close(c.grad, e.grad, rtol=rtol, atol=atol, msg=f"grad of input {i}")
    return compiled


def compile_module(model: torch.nn.Module, backend: Callable[..., Any] | None = None) -> tuple[Any, list[Any]]:
    """torch.compile(model, backend=aot_eager) with static shapes; also returns each compiled graph."""
    results: list[Any] = []

    def be(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        c = (backend or aot_eager)(gm, example_inputs)
        results.append(c)
        return c
    torch._dynamo.reset()
    return torch.compile(model, backend=be, dynamic=False), results


def eager_saved_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of the distinct tensors eager autograd saves while ``fn`` runs (saved-tensor hooks)."""
    seen: dict[tuple[Any, ...], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        seen[key] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def check_module_training(model: torch.nn.Module, make_inputs: Callable[[], Sequence[Any]], *,
                          loss_fn: Callable[[Any], torch.Tensor] | None = None, steps: int = 1,
                          rtol: float = 1e-4, atol: float = 1e-5, lr: float = 0.01,
                          saved_vs_eager: bool = False, capture: str = "dynamo") -> list[Any]:
    """Train a deep copy eagerly and one compiled with aot_eager for ``steps`` SGD steps; compare the
    loss, every parameter's gradient, and all buffers after each step."""
    eager = model
    comp = copy.deepcopy(model)
    if capture == "dynamo":
        compiled, graphs = compile_module(comp)
    else:  # fx.symbolic_trace: parameters stay get_attr and kiln lifts them (no dynamo cost)
        gm = fx.symbolic_trace(comp)
        graphs = []

        def compiled(*args: Any) -> Any:
            if not graphs:
                graphs.append(aot_eager(gm, list(args)))
            return graphs[0](*args)
    loss_fn = loss_fn or (lambda out: _loss(out))
    opt_e = torch.optim.SGD(eager.parameters(), lr=lr)
    opt_c = torch.optim.SGD(comp.parameters(), lr=lr)
    eager_bytes = None
    for step in range(steps):
        torch.manual_seed(step)
        inputs = make_inputs()
        if saved_vs_eager and step == 0:
            eager_bytes = eager_saved_bytes(lambda inputs=inputs: loss_fn(copy.deepcopy(eager)(*inputs)))
        torch.manual_seed(1000 + step)
        le = loss_fn(eager(*inputs))
        le.backward()
        torch.manual_seed(1000 + step)
        lc = loss_fn(compiled(*inputs))
        lc.backward()
        torch.testing.assert_close(lc, le, rtol=rtol, atol=atol, msg=f"loss at step {step}")
        for (name, pe), pc in zip(eager.named_parameters(), comp.parameters()):
            assert (pe.grad is None) == (pc.grad is None), name
            if pe.grad is not None:
                torch.testing.assert_close(pc.grad, pe.grad, rtol=rtol, atol=atol,
                                           msg=f"grad of {name} at step {step}")
        for (name, be_), bc in zip(eager.named_buffers(), comp.buffers()):
            torch.testing.assert_close(bc, be_, rtol=rtol, atol=atol, msg=f"buffer {name} at step {step}")
        opt_e.step()
        opt_c.step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    assert graphs, "torch.compile never called the kiln backend"
    from kiln.autograd import partition
    total = 0
    for g in graphs:  # min-cut never saves more than save-everything
        parts = g.aot.partitioned
        if parts is not None:
            assert parts.saved_bytes <= partition(g.aot.joint, "save_all").saved_bytes
            total += parts.saved_bytes
    if eager_bytes is not None:
        assert total <= eager_bytes, f"min-cut saves {total} bytes, eager {eager_bytes}"
    return graphs
