"""What a load does not do any more (load + first call <= 2x eager's first call, issue 7)."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_testlib import ATEN

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import ArtifactError, load_artifact, load_compiled_function, save_artifact
from kiln.runtime import manifest as manifest_mod


def _save(path, fmt="dir"):
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    save_artifact(path, PortableProgram(ATEN), input_names=["x", "w", "b"],
                  input_specs=[TensorSpec.from_tensor(t) for t in (x, w, b)], backend="test",
                  format=fmt)
    return x, w, b


def test_manifest_integrity_is_checked_over_its_bytes(tmp_path, monkeypatch):
    """The saved manifest is its canonical JSON + the integrity: a load hashes the bytes as read,
    without re-encoding the parsed manifest (3-4 ms for a mobilenet's)."""
    x, w, b = _save(tmp_path / "a")
    raw = (tmp_path / "a" / "manifest.json").read_bytes()
    d = json.loads(raw)
    assert raw.endswith(b',"integrity":"' + d["integrity"].encode() + b'"}')
    assert d["integrity"] == manifest_mod.integrity_of(d)  # the same hash as schema 1 defined

    def no_reencode(_d):
        raise AssertionError("the load re-encoded the manifest to check its integrity")
    monkeypatch.setattr(manifest_mod, "verify_integrity", no_reencode)
    fn = load_compiled_function(tmp_path / "a")
    torch.testing.assert_close(fn(x, w, b)[0], torch.relu(x @ w.t() + b))


def test_manifest_written_by_older_versions_still_verifies(tmp_path):
    """An indented manifest (as written before) is verified by re-encoding it, and a change to it
    is still caught."""
    x, w, b = _save(tmp_path / "a")
    path = tmp_path / "a" / "manifest.json"
    d = json.loads(path.read_bytes())
    path.write_text(json.dumps(d, indent=1, sort_keys=True))
    fn = load_compiled_function(tmp_path / "a")
    torch.testing.assert_close(fn(x, w, b)[0], torch.relu(x @ w.t() + b))
    d["backend"] = "edited"
    path.write_text(json.dumps(d, indent=1, sort_keys=True))
    with pytest.raises(ArtifactError, match="integrity"):
        load_artifact(tmp_path / "a")


@pytest.mark.parametrize("edit", [
    lambda raw: raw.replace(b'"backend":"test"', b'"backend":"tesT"'),
    lambda raw: raw.replace(b'"backend":"test"', b'"backend": "test"'),  # same JSON, other bytes
    lambda raw: raw[:-3] + (b"0" if raw[-3:-2] != b"0" else b"1") + raw[-2:],  # the hash itself
])
def test_edited_canonical_manifest_is_refused_or_reverified(tmp_path, edit):
    _save(tmp_path / "a")
    path = tmp_path / "a" / "manifest.json"
    raw = path.read_bytes()
    path.write_bytes(edit(raw))
    same_json = json.loads(edit(raw)) == json.loads(raw)
    if same_json:  # whitespace only: the bytes differ, the re-encoded check accepts it
        load_artifact(tmp_path / "a")
    else:
        with pytest.raises(ArtifactError, match="integrity"):
            load_artifact(tmp_path / "a")


LOAD_ONLY = '''
import sys, torch
from kiln.runtime import load_compiled_function
x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
out = load_compiled_function(sys.argv[1])(x, w, b)[0]
assert torch.allclose(out, torch.relu(x @ w.t() + b))
heavy = sorted(m for m in ("sympy", "kiln.capture", "networkx") if m in sys.modules)
print("heavy modules:", heavy)
'''


def test_loading_a_static_artifact_imports_neither_sympy_nor_the_compiler(tmp_path):
    """A deployment process loading a static-shape artifact pays no sympy import (~0.3 s, 20x a
    small model's first eager call) and no capture stage."""
    import os
    import subprocess
    import sys

    _save(tmp_path / "a.kiln", fmt="zip")
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", LOAD_ONLY, str(tmp_path / "a.kiln")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "heavy modules: []" in proc.stdout, proc.stdout


def test_guard_plan_parses_each_distinct_segment_once(monkeypatch):
    """Building the check of a module's guards (thousands of sources over a few dozen distinct
    attribute/subscript segments) runs the segment regex once per distinct segment, not per
    source; the plan still checks every guard."""
    from kiln.graph import Guard, GuardSet, guards_plan

    calls = []
    real = guards_plan._SEGMENT

    class Counting:
        def fullmatch(self, s):
            calls.append(s)
            return real.fullmatch(s)
    monkeypatch.setattr(guards_plan, "_SEGMENT", Counting())
    monkeypatch.setattr(guards_plan, "_GETTERS", {})

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 2, 1)
    net = torch.nn.Sequential(*[Block() for _ in range(40)])
    guards = []
    for i in range(40):
        base = f"L['net']._modules['{i}']._modules['conv']"
        guards += [Guard(f"{base}.stride", "EQUALS_MATCH", (1, 1)),
                   Guard(f"{base}.groups", "EQUALS_MATCH", 1),
                   Guard(f"{base}.padding_mode", "EQUALS_MATCH", "zeros")]
    check = GuardSet(tuple(guards)).compile_gather(["L['net']._modules['3']._modules['conv'].weight"])
    got = check({"net": net}, {})
    assert got is not None and got[0] is net[3].conv.weight
    distinct = {"._modules", "['conv']", ".stride", ".groups", ".padding_mode", ".weight"} | {
        f"['{i}']" for i in range(40)}
    assert len(calls) <= len(distinct) + 5, f"{len(calls)} regex calls for {len(distinct)} segments"
    net[7].conv.groups = 2
    assert check({"net": net}, {}) is None


def test_guard_plan_reads_an_argument_root_without_eval(monkeypatch):
    """``L['self'].config``: ``L['self']`` is read from L directly; it was a child of an ``L`` node
    built by eval() (a compile in every new process's load)."""
    from kiln.graph import Guard, GuardSet, guards_plan

    evals = []
    monkeypatch.setattr(guards_plan, "eval", lambda s, *a: evals.append(s) or eval(s, *a), raising=False)
    m = torch.nn.Linear(2, 2)
    check = GuardSet((Guard("L['self'].training", "EQUALS_MATCH", True),
                      Guard("L['self'].in_features", "EQUALS_MATCH", 2))).compile_gather(["L['self'].weight"])
    assert evals == []
    assert check({"self": m}, {})[0] is m.weight
    m.eval()
    assert check({"self": m}, {}) is None
    assert check.__kiln_reads__ == 4  # L['self'] and its three attributes
