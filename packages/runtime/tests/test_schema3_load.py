"""Schema 3's load path: the saved guard plan, InputRecords made on first use, and the fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from kiln.graph import Guard, GuardSet, PortableProgram, TensorSpec
from kiln.runtime import GuardError, load_artifact, load_compiled_function, save_artifact

PROGRAM = PortableProgram("import torch\n\ndef call(args):\n    x, w, b = args\n"
                          "    return (torch.relu(torch.nn.functional.linear(x, w, b)),)\n")
SOURCES = ["L['x']", "L['self'].fc.weight", "L['self'].fc.bias"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.scale = 2


def _save(path, **kw):
    net, x = Net(), torch.randn(4, 8)
    specs = [TensorSpec.from_tensor(t) for t in (x, net.fc.weight, net.fc.bias)]
    save_artifact(path, PROGRAM, input_sources=SOURCES, input_specs=specs,
                  guards=[Guard("L['self'].scale", "EQUALS_MATCH", 2),
                          Guard("L['self'].fc.in_features", "EQUALS_MATCH", 8)], **kw)
    return net, x


def test_a_load_builds_its_check_from_the_saved_plan(tmp_path, monkeypatch):
    net, x = _save(tmp_path / "a.kiln")
    assert len(load_artifact(tmp_path / "a.kiln").manifest.guard_layout["outputs"]) == 3

    def no_analysis(*a, **k):
        raise AssertionError("the load analysed the guards again")
    monkeypatch.setattr(GuardSet, "compile_gather", no_analysis)
    fn = load_compiled_function(tmp_path / "a.kiln")
    torch.testing.assert_close(fn(x, net)[0], F.relu(net.fc(x)))
    # InputRecords and names are made only when something needs them: an error here
    assert fn.artifact.manifest.inputs._items is None
    assert fn.artifact.manifest.guards.guards._items is None  # the check was built from records
    net.scale = 3
    with pytest.raises(GuardError, match="scale"):
        fn(x, net)
    net.scale = 2
    with pytest.raises(GuardError, match="self.fc.weight"):
        fn(x, Net().double())
    with pytest.raises(GuardError, match="'x'"):
        fn(torch.randn(5, 8), net)


def test_a_load_that_rebinds_a_prefix_rebuilds_the_plan(tmp_path):
    """External data rebinds ``L['model']`` (a closure's module): the saved plan (over the saved
    sources) does not apply, and the rebuilt one checks the external object."""
    from kiln.runtime import CallFrame

    model, x = Net(), torch.randn(4, 8)

    def f(x):
        return model(x)
    specs = [TensorSpec.from_tensor(t) for t in (x, model.fc.weight, model.fc.bias)]
    save_artifact(tmp_path / "e.kiln", PROGRAM, frame=CallFrame.of(f, (x,)), external_data={"net": model},
                  input_sources=["L['x']", "L['model'].fc.weight", "L['model'].fc.bias"], input_specs=specs,
                  guards=[Guard("L['model'].fc.in_features", "EQUALS_MATCH", 8)])
    other = Net()
    fn = load_compiled_function(tmp_path / "e.kiln", external_data={"net": other})
    assert fn.plan.layout is None
    torch.testing.assert_close(fn(x)[0], F.relu(other.fc(x)))
    other.fc.in_features = 9
    with pytest.raises(GuardError, match="in_features"):
        fn(x)


def test_a_plan_that_does_not_fit_is_logged_and_rebuilt(tmp_path, caplog):
    import dataclasses

    from kiln.runtime import Artifact

    net, x = _save(tmp_path / "a.kiln")
    art = load_artifact(tmp_path / "a.kiln")
    layout = dict(art.manifest.guard_layout)
    layout["outputs"] = layout["outputs"][:1]  # gathers fewer values than the call needs
    odd = Artifact(dataclasses.replace(art.manifest, guard_layout=layout), art.source, art.files,
                   art.constants)
    with caplog.at_level(logging.WARNING, logger="kiln.runtime"):
        fn = load_compiled_function(odd)
    assert "rebuilding it" in caplog.text
    torch.testing.assert_close(fn(x, net)[0], F.relu(net.fc(x)))


FLAG = True


def test_a_dropped_global_guard_keeps_the_saved_plan(tmp_path):
    """transformers models guard a module global (``G['_is_torch_available']``): loaded without
    f_globals that guard is dropped, and the saved plan is still used, without it; with f_globals it
    is checked."""
    from kiln.runtime import CallFrame

    net, x = Net(), torch.randn(4, 8)

    def forward(self, x):
        return F.relu(self.fc(x)) if FLAG else x
    specs = [TensorSpec.from_tensor(t) for t in (x, net.fc.weight, net.fc.bias)]
    save_artifact(tmp_path / "g.kiln", PROGRAM, frame=CallFrame.of(forward, (net, x)),
                  input_sources=SOURCES, input_specs=specs,
                  guards=[Guard("G['FLAG']", "EQUALS_MATCH", True), Guard("L['self'].scale", "EQUALS_MATCH", 2)])
    fn = load_compiled_function(tmp_path / "g.kiln")
    assert fn.plan.layout is not None and len(fn.plan.guards) == len(fn.plan.records) - 1
    torch.testing.assert_close(fn(net, x)[0], F.relu(net.fc(x)))
    net.scale = 3
    with pytest.raises(GuardError, match="scale"):
        fn(net, x)
    net.scale = 2
    live = load_compiled_function(tmp_path / "g.kiln", f_globals={"FLAG": False})
    assert live.plan.layout is not None and len(live.plan.guards) == len(live.plan.records)
    with pytest.raises(GuardError, match="FLAG"):
        live(net, x)
    torch.testing.assert_close(load_compiled_function(tmp_path / "g.kiln", f_globals={"FLAG": True})(net, x)[0],
                               F.relu(net.fc(x)))
