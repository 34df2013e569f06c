"""The AOT workflow the meta-package builds on this API, with FX-traced graphs standing in for
capture and ``program_from_graph_module`` for a backend: compile in process, call, save, load."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import fx

from kiln.graph import Guard, PortableProgram, TensorSpec
from kiln.runtime import (
    ArtifactError,
    CallFrame,
    GuardError,
    LoadedFunction,
    load_compiled_function,
    program_from_graph_module,
    save_artifact,
)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def mlp_graph(w1, b1, w2, b2, x):  # what capture produces: parameters lifted to inputs
    return (F.linear(F.relu(F.linear(x, w1, b1)), w2, b2),)


PARAM_SOURCES = ["L['self'].fc1.weight", "L['self'].fc1.bias", "L['self'].fc2.weight",
                 "L['self'].fc2.bias"]


def aot_compile_forward(model, x) -> LoadedFunction:
    """``kiln.compile(model, fullgraph=True).forward.aot_compile(((x,), {}))``, by hand."""
    gm = fx.symbolic_trace(mlp_graph)
    sources = [*PARAM_SOURCES, "L['x']"]
    values = [model.fc1.weight, model.fc1.bias, model.fc2.weight, model.fc2.bias, x]
    return LoadedFunction.from_compiled(
        lambda args: gm(*args), frame=CallFrame.of(model.forward, (x,)), input_sources=sources,
        input_specs=[TensorSpec.from_tensor(v) for v in values],
        guards=[Guard("L['self']", "ID_MATCH", id(model)),  # in process only; dropped when saved
                Guard("L['self'].training", "EQUALS_MATCH", model.training)],
        output_spec=pytree.tree_flatten(torch.empty(0))[1], program=program_from_graph_module(gm),
        backend="eager")


def test_module_forward_with_backward_save_and_load(tmp_path):
    torch.manual_seed(0)
    model, ref = MLP(), MLP()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(3, 8)
    compiled = aot_compile_forward(model, x)
    out = compiled(model, x)
    torch.testing.assert_close(out, ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(model.fc1.weight.grad, ref.fc1.weight.grad)
    compiled.save_compiled_function(tmp_path / "mlp.kiln")
    assert [g.kind for g in compiled.artifact.guards].count("ID_MATCH") == 0
    loaded = load_compiled_function(tmp_path / "mlp.kiln")
    other = MLP()  # a different instance: ID_MATCH was not saved, the rest is checked
    loaded(other, x).sum().backward()
    other_ref = MLP()
    other_ref.load_state_dict(other.state_dict())
    other_ref(x).sum().backward()
    torch.testing.assert_close(other.fc2.weight.grad, other_ref.fc2.weight.grad)
    with pytest.raises(GuardError, match="input 'self.training': expected value True, got False"):
        loaded(other.eval(), x)


def test_loaded_guards_still_check_everything(tmp_path):
    """The vectorised guard check rejects what the per-guard one did, and names the input."""
    model, x = MLP(), torch.randn(3, 8)
    aot_compile_forward(model, x).save_compiled_function(tmp_path / "mlp.kiln")
    loaded = load_compiled_function(tmp_path / "mlp.kiln")
    torch.testing.assert_close(loaded(model, x), model(x))
    with pytest.raises(GuardError, match=r"input 'x': expected shape \(3, 8\), got \(3, 9\)"):
        loaded(model, torch.randn(3, 9))
    with pytest.raises(GuardError, match="input 'x': expected dtype float32, got float64"):
        loaded(model, x.double())
    with pytest.raises(GuardError, match="input 'x': expected device cpu, got meta"):
        loaded(model, x.to("meta"))
    changed = MLP()
    changed.fc2 = torch.nn.Linear(16, 5)  # a parameter of another shape
    with pytest.raises(GuardError, match=r"input 'self.fc2.weight': expected shape \(4, 16\), got \(5, 16\)"):
        loaded(changed, x)
    frozen = MLP()
    frozen.fc1.weight.requires_grad_(False)
    with pytest.raises(GuardError, match="input 'self.fc1.weight': expected requires_grad True"):
        loaded(frozen, x)
    gone = MLP()
    del gone.fc1  # a source that cannot be read any more: a GuardError, not an AttributeError
    with pytest.raises(GuardError, match="self.fc1"):
        loaded(gone, x)


def test_in_process_guards_include_identity(tmp_path):
    model, x = MLP(), torch.randn(3, 8)
    compiled = aot_compile_forward(model, x)
    with pytest.raises(GuardError, match="input 'self'"):
        compiled(MLP(), x)
    compiled.disable_guard_check()
    other = MLP()
    torch.testing.assert_close(compiled(other, x), other(x))


def test_training_loop_through_a_loaded_closure(tmp_path):
    """A free function closing over a module: external_data at save and at load, then train."""
    torch.manual_seed(0)
    model, ref = MLP(), MLP()
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(6, 8), torch.randn(6, 4)

    def loss_fn(x, y):
        return F.mse_loss(model(x), y)

    def captured(w1, b1, w2, b2, x, y):
        return (F.mse_loss(mlp_graph(w1, b1, w2, b2, x)[0], y),)

    gm = fx.symbolic_trace(captured)
    sources = [s.replace("L['self']", "L['model']") for s in PARAM_SOURCES] + ["L['x']", "L['y']"]
    compiled = LoadedFunction.from_compiled(
        lambda args: gm(*args), frame=CallFrame.of(loss_fn, (x, y)), input_sources=sources,
        output_spec=pytree.tree_flatten(torch.empty(0))[1], program=program_from_graph_module(gm))
    torch.testing.assert_close(compiled(x, y), loss_fn(x, y))
    with pytest.raises(ArtifactError, match="external_data"):
        compiled.save_compiled_function(tmp_path / "loss.kiln")
    compiled.save_compiled_function(tmp_path / "loss.kiln", external_data={"model": model})
    loaded = load_compiled_function(tmp_path / "loss.kiln", external_data={"model": model})
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref))
    for _ in range(3):
        for fn, o in ((loaded, opt), (lambda a, b: F.mse_loss(ref(a), b), ref_opt)):
            o.zero_grad()
            fn(x, y).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_backend_without_portable_program_cannot_save(tmp_path):
    x = torch.randn(2)

    def f(x):
        return x + 1

    compiled = LoadedFunction.from_compiled(lambda a: (a[0] + 1,), frame=CallFrame.of(f, (x,)),
                                            input_sources=["L['x']"], backend="custom")
    assert compiled(x)[0].equal(x + 1)
    with pytest.raises(ArtifactError, match="backend 'custom' produced no portable program"):
        compiled.save_compiled_function(tmp_path / "f.kiln")


def _load_in_child(path: str, queue) -> None:
    fn = load_compiled_function(path)
    queue.put(sorted(os.listdir(fn.module.FILES_DIR)))


def test_processes_loading_one_artifact_at_once(tmp_path):
    program = PortableProgram("def call(args):\n    return (FILES['blob.bin'],)\n",
                              files={"blob.bin": os.urandom(1 << 16)})
    save_artifact(tmp_path / "p.kiln", program, input_names=["x"])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_in_child, args=(str(tmp_path / "p.kiln"), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert results == [["blob.bin", "program.py"]] * 3
    fn = load_compiled_function(tmp_path / "p.kiln")
    assert fn(None)[0] == program.files["blob.bin"]
