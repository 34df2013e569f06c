"""Save/load round trips of hand-written PortablePrograms, in both physical forms."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from runtime_testlib import ATEN, AUTOGRAD

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import (
    SCHEMA_VERSION,
    Artifact,
    GuardError,
    build_artifact,
    load_artifact,
    load_compiled_function,
    save_artifact,
)


def _aten_inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)


def _eager_aten(x, w, b):
    y = F.linear(x, w, b)
    return torch.relu(y), y.sum()


@pytest.mark.parametrize("form", ["zip", "dir", "fileobj"])
def test_aten_program_round_trip(tmp_path, form):
    x, w, b = _aten_inputs()
    kwargs = dict(input_names=["x", "w", "b"], input_specs=[TensorSpec.from_tensor(t) for t in (x, w, b)],
                  backend="test", metadata={"note": "hand-written"})
    if form == "fileobj":
        buf = io.BytesIO()
        save_artifact(buf, PortableProgram(ATEN), **kwargs)
        buf.seek(0)
        loaded = load_compiled_function(buf)
    else:
        path = tmp_path / ("fn.kiln" if form == "zip" else "fn_dir")
        save_artifact(path, PortableProgram(ATEN), format="auto" if form == "zip" else "dir", **kwargs)
        assert path.is_dir() == (form == "dir")
        loaded = load_compiled_function(path)
    got = loaded(x, w, b)
    want = _eager_aten(x, w, b)
    assert isinstance(got, tuple) and len(got) == 2
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    # keyword arguments bind by name, like the original function
    torch.testing.assert_close(loaded(x, b=b, w=w)[0], want[0])


def test_artifact_inspection(tmp_path):
    x, w, b = _aten_inputs()
    art = save_artifact(tmp_path / "a.kiln", PortableProgram(ATEN), input_names=["x", "w", "b"],
                        input_specs=[TensorSpec.from_tensor(t) for t in (x, w, b)], backend="test")
    loaded = load_artifact(tmp_path / "a.kiln")
    assert isinstance(loaded, Artifact)
    assert loaded.manifest.integrity == art.manifest.integrity
    assert loaded.program.source == ATEN
    text = loaded.as_text()
    for needle in (f"schema {SCHEMA_VERSION}", "backend: test", "TENSOR_MATCH", "L['x']", "program.py", "integrity",
                   "aten.addmm", f"torch {torch.__version__.split('+')[0]}"):
        assert needle in text, needle
    # the same artifact saved twice is byte-identical apart from nothing: hashes are stable
    again = build_artifact(PortableProgram(ATEN), input_names=["x", "w", "b"],
                           input_specs=[TensorSpec.from_tensor(t) for t in (x, w, b)], backend="test")
    assert again.manifest.files == art.manifest.files


def test_autograd_function_backward_after_load(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=False)
    ref = torch.nn.Linear(8, 4, bias=False)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 8)
    path = tmp_path / "train.kiln"
    save_artifact(path, PortableProgram(AUTOGRAD), input_sources=["L['self'].weight", "L['x']"],
                  input_specs=[TensorSpec.from_tensor(model.weight), TensorSpec.from_tensor(x)],
                  output_spec=pytree.tree_flatten(torch.empty(0))[1])
    fn = load_compiled_function(path)
    assert [p.name for p in fn.artifact.manifest.params] == ["self", "x"]
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    for _ in range(3):  # a few optimizer steps through the loaded function
        out = fn(model, x)
        assert isinstance(out, torch.Tensor)
        out.square().sum().backward()
        torch.tanh(ref(x)).square().sum().backward()
        torch.testing.assert_close(model.weight.grad, ref.weight.grad)
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    torch.testing.assert_close(model.weight, ref.weight)


def test_output_structure_is_restored(tmp_path):
    x, w, b = _aten_inputs()
    spec = pytree.tree_flatten({"act": 0, "total": 0})[1]
    save_artifact(tmp_path / "d.kiln", PortableProgram(ATEN), input_names=["x", "w", "b"],
                  output_spec=spec)
    out = load_compiled_function(tmp_path / "d.kiln")(x, w, b)
    assert set(out) == {"act", "total"}
    torch.testing.assert_close(out["total"], _eager_aten(x, w, b)[1])


def test_loaded_function_resaves(tmp_path):
    x, w, b = _aten_inputs()
    save_artifact(tmp_path / "a.kiln", PortableProgram(ATEN), input_names=["x", "w", "b"])
    fn = load_compiled_function(tmp_path / "a.kiln")
    fn.save_compiled_function(tmp_path / "copy.kiln")
    again = load_compiled_function(tmp_path / "copy.kiln")
    torch.testing.assert_close(again(x, w, b)[0], fn(x, w, b)[0])
    assert "LoadedFunction (x, w, b)" in repr(fn)


def test_reserved_and_unsafe_file_names_are_refused(tmp_path):
    from kiln.runtime import ArtifactError

    for bad in ("program.py", "../escape.so", "/abs.so", "manifest.json", "a//b"):
        with pytest.raises(ArtifactError):
            build_artifact(PortableProgram(ATEN, files={bad: b"x"}), input_names=["x", "w", "b"])


def test_program_without_call_is_an_artifact_error(tmp_path):
    from kiln.runtime import ArtifactError

    save_artifact(tmp_path / "n.kiln", PortableProgram("import torch\n"), input_names=["x"])
    with pytest.raises(ArtifactError, match="defines no call"):
        load_compiled_function(tmp_path / "n.kiln")
    save_artifact(tmp_path / "m.kiln", PortableProgram("import not_a_module_kiln\n"),
                  input_names=["x"])
    with pytest.raises(ArtifactError, match="ModuleNotFoundError"):
        load_compiled_function(tmp_path / "m.kiln")


def _schema2_artifact(tmp_path, version=2):
    """An artifact as kiln-runtime wrote it at schema ``version`` (the manifest writes each schema)."""
    import dataclasses

    from kiln.graph import Guard, tensor_expectation

    x, w, b = _aten_inputs()
    guards = [Guard("L['x']", "TENSOR_MATCH", tensor_expectation(x)),  # what x's spec gives: left out
              Guard("L['w']", "TENSOR_MATCH", tensor_expectation(w, frozenset({0}))),  # not: kept
              Guard("L['n']", "EQUALS_MATCH", 3)]
    art = build_artifact(PortableProgram(ATEN), input_names=["x", "w", "b"],
                         input_specs=[TensorSpec.from_tensor(t) for t in (x, w, b)], guards=guards)
    if version != SCHEMA_VERSION:
        art = Artifact(dataclasses.replace(art.manifest, schema_version=version, integrity="").sealed(),
                       art.source, art.files, art.constants)
    art.save(tmp_path / "a.kiln")
    return art, (x, w, b)


def test_schema2_leaves_out_the_tensor_guards_input_specs_give(tmp_path):
    import json
    import zipfile

    art, (x, w, b) = _schema2_artifact(tmp_path)
    with zipfile.ZipFile(tmp_path / "a.kiln") as z:
        raw = json.loads(z.read("manifest.json"))
    assert raw["schema_version"] == 2
    stored = {(g["source"], g["kind"]) for g in raw["guards"]}
    assert stored == {("L['w']", "TENSOR_MATCH"), ("L['n']", "EQUALS_MATCH")}
    loaded = load_artifact(tmp_path / "a.kiln")
    key = lambda g: (g.source, g.kind, g.expected)  # noqa: E731
    assert sorted(map(key, loaded.manifest.guards)) == sorted(map(key, art.manifest.guards))
    assert len(loaded.manifest.guards) == 4  # x and b rebuilt from their specs
    fn = load_compiled_function(tmp_path / "a.kiln")
    want = (F.relu(x @ w.t() + b), (x @ w.t() + b).sum())
    torch.testing.assert_close(fn(x, w, b, n=3)[0], want[0])
    with pytest.raises(GuardError, match="'x'"):
        fn(torch.randn(5, 4), w, b, n=3)
    with pytest.raises(GuardError, match="'b'"):
        fn(x, w, b.double(), n=3)
    # a loaded schema-2 artifact saves the same manifest again (its integrity still verifies)
    load_compiled_function(tmp_path / "a.kiln").save_compiled_function(tmp_path / "again.kiln")
    assert load_artifact(tmp_path / "again.kiln").manifest.integrity == art.manifest.integrity


def test_a_schema1_manifest_keeps_every_guard_and_still_loads(tmp_path):
    import dataclasses
    import json
    import zipfile

    art, (x, w, b) = _schema2_artifact(tmp_path)
    old = dataclasses.replace(art.manifest, schema_version=1, integrity="").sealed()
    Artifact(old, art.source, art.files, art.constants).save(tmp_path / "old.kiln")
    with zipfile.ZipFile(tmp_path / "old.kiln") as z:
        raw = json.loads(z.read("manifest.json"))
    assert raw["schema_version"] == 1 and len(raw["guards"]) == 4
    loaded = load_artifact(tmp_path / "old.kiln")
    assert loaded.manifest.schema_version == 1 and len(loaded.manifest.guards) == 4
    fn = load_compiled_function(tmp_path / "old.kiln")
    with pytest.raises(GuardError, match="'x'"):
        fn(torch.randn(5, 4), w, b, n=3)
    fn.save_compiled_function(tmp_path / "again.kiln")  # re-saved as it was: schema 1, same integrity
    assert load_artifact(tmp_path / "again.kiln").manifest.integrity == old.integrity


def test_schema3_writes_sources_once_as_a_tree(tmp_path):
    """Schema 3: each source and prefix is one row of ``sources``; inputs and guards name rows; the
    loaded manifest has the same inputs and guards as schema 2's, and the loaded function's guard
    plan is built from the tree."""
    import json
    import zipfile

    from kiln.graph import Guard

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 16)
            self.scale = 2

        def forward(self, x):
            return F.relu(self.fc(x)) * self.scale

    net = Net()
    x = torch.randn(4, 8)
    sources = ["L['x']", "L['self'].fc.weight", "L['self'].fc.bias"]
    guards = [Guard("L['self'].scale", "EQUALS_MATCH", 2, "model.py:9"),
              Guard("L['self'].fc.in_features", "EQUALS_MATCH", 8, "model.py:9")]
    specs = [TensorSpec.from_tensor(t) for t in (x, net.fc.weight, net.fc.bias)]
    prog = PortableProgram("import torch\n\ndef call(args):\n    x, w, b = args\n"
                           "    return (torch.relu(torch.nn.functional.linear(x, w, b)),)\n")
    art = save_artifact(tmp_path / "a.kiln", prog, input_sources=sources,
                        input_names=["x", "weight", "self.fc.bias"], input_specs=specs, guards=guards)
    with zipfile.ZipFile(tmp_path / "a.kiln") as z:
        raw = json.loads(z.read("manifest.json"))
    assert raw["schema_version"] == 3
    rows = raw["sources"]
    text = [None] * len(rows)
    for i, (parent, segment) in enumerate(rows):
        text[i] = segment if parent < 0 else text[parent] + segment
    assert len(set(text)) == len(text) and "L['self'].fc" in text
    assert [[text[i], name] for i, name, _ in raw["inputs"]] == [
        ["L['x']", None], ["L['self'].fc.weight", "weight"], ["L['self'].fc.bias", None]]
    assert {(text[i], kind, raw["notes"][n]) for i, kind, _, n in raw["guards"]} >= {
        ("L['self'].scale", "EQUALS_MATCH", "model.py:9")}
    assert "source" not in json.dumps(raw["guards"]) and "L['self'].fc.weight" not in json.dumps(raw["inputs"])

    loaded = load_artifact(tmp_path / "a.kiln")
    key = lambda g: (g.source, g.kind, g.expected)  # noqa: E731
    assert sorted(map(key, loaded.manifest.guards)) == sorted(map(key, art.manifest.guards))
    assert {g.note for g in loaded.manifest.guards if g.kind == "EQUALS_MATCH"} == {"model.py:9"}
    assert loaded.manifest.inputs == art.manifest.inputs
    assert loaded.manifest.source_tree and loaded.manifest.integrity == art.manifest.integrity

    fn = load_compiled_function(tmp_path / "a.kiln")
    assert fn.plan.tree == loaded.manifest.source_tree
    torch.testing.assert_close(fn(x, net)[0], F.relu(net.fc(x)))
    net.scale = 3
    with pytest.raises(GuardError, match="scale"):
        fn(x, net)
    net.scale = 2
    with pytest.raises(GuardError, match="'weight'"):
        fn(x, Net().double())
    fn.save_compiled_function(tmp_path / "again.kiln")  # re-saved: the same manifest
    assert load_artifact(tmp_path / "again.kiln").manifest.integrity == art.manifest.integrity


def test_a_schema3_manifest_with_a_bad_source_row_is_an_artifact_error(tmp_path):
    import json
    import zipfile

    from kiln.runtime import ArtifactError
    from kiln.runtime.manifest import manifest_file_bytes

    _schema2_artifact(tmp_path, version=3)
    with zipfile.ZipFile(tmp_path / "a.kiln") as z:
        raw = json.loads(z.read("manifest.json"))
        files = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
    from kiln.runtime.container import zip_bytes

    def write(broken):
        broken.pop("integrity", None)
        (tmp_path / "bad.kiln").write_bytes(zip_bytes(manifest_file_bytes(broken), files))
    write({**raw, "sources": [[5, "['x']"], *raw["sources"][1:]]})  # a parent after its child
    with pytest.raises(ArtifactError, match="malformed"):
        load_artifact(tmp_path / "bad.kiln")
    write({**raw, "guards": [[g[0], "BOGUS_MATCH", *g[2:]] for g in raw["guards"]]})
    with pytest.raises(ArtifactError, match="malformed.*BOGUS_MATCH"):
        load_artifact(tmp_path / "bad.kiln")
