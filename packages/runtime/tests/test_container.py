"""Truncated, corrupt and incomplete artifacts raise ArtifactError saying what is wrong."""

from __future__ import annotations

import json
import random
import shutil
import zipfile

import pytest
import torch
from runtime_testlib import MATMUL, reseal

from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import ArtifactError, load_artifact, load_compiled_function, save_artifact


def _save(path, fmt="auto"):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    program = PortableProgram(MATMUL, files={"notes/data.bin": bytes(range(256)) * 4})
    save_artifact(path, program, input_names=["w", "x"], format=fmt,
                  input_specs=[TensorSpec.from_tensor(w), TensorSpec.from_tensor(x)])
    return w, x


def test_truncated_zip(tmp_path):
    path = tmp_path / "a.kiln"
    _save(path)
    data = path.read_bytes()
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ArtifactError, match="bad zip file.*truncated, corrupt, or not an artifact"):
            load_artifact(path)


def test_random_corruption_never_escapes_as_another_error(tmp_path):
    path = tmp_path / "a.kiln"
    w, x = _save(path)
    data = path.read_bytes()
    rng = random.Random(0)
    outcomes = set()
    for offset in rng.sample(range(len(data)), 40):
        bad = bytearray(data)
        bad[offset] ^= 0xFF
        path.write_bytes(bytes(bad))
        try:
            fn = load_compiled_function(path)
        except ArtifactError:
            outcomes.add("error")
            continue
        # a flipped byte the checksums do not cover (zip timestamps, padding) changes nothing
        torch.testing.assert_close(fn(w, x)[0], x @ w)
        outcomes.add("loaded")
    assert len(outcomes) >= 2


def test_missing_file_in_directory(tmp_path):
    _save(tmp_path / "d", fmt="dir")
    (tmp_path / "d" / "notes" / "data.bin").unlink()
    with pytest.raises(ArtifactError, match="missing file 'notes/data.bin' listed in its manifest"):
        load_artifact(tmp_path / "d")


def test_checksum_mismatch_names_the_file(tmp_path):
    _save(tmp_path / "d", fmt="dir")
    program = tmp_path / "d" / "program.py"
    program.write_text(program.read_text().replace("aten.mm(x, w)", "aten.mm(x, w) * 2"))
    with pytest.raises(ArtifactError, match="checksum mismatch for file 'program.py'"):
        load_artifact(tmp_path / "d")


def test_manifest_tampering_fails_integrity(tmp_path):
    _save(tmp_path / "d", fmt="dir")
    m = tmp_path / "d" / "manifest.json"
    d = json.loads(m.read_text())
    d["backend"] = "something-else"
    m.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="fails its integrity check"):
        load_artifact(tmp_path / "d")


def test_unknown_schema_and_foreign_manifests(tmp_path):
    _save(tmp_path / "d", fmt="dir")
    reseal(tmp_path / "d", lambda d: d.update(schema_version=99))
    with pytest.raises(ArtifactError, match="unknown artifact schema version 99"):
        load_artifact(tmp_path / "d")
    reseal(tmp_path / "d", lambda d: d.update(format="something"))
    with pytest.raises(ArtifactError, match="not a kiln artifact"):
        load_artifact(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text("{ not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_artifact(tmp_path / "d")


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        load_artifact(tmp_path / "nope.kiln")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        load_artifact(tmp_path / "empty")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactError, match="zip file but not a kiln artifact"):
        load_artifact(tmp_path / "other.zip")


def test_dir_and_zip_hold_the_same_files(tmp_path):
    _save(tmp_path / "d", fmt="dir")
    _save(tmp_path / "z.kiln")
    with zipfile.ZipFile(tmp_path / "z.kiln") as z:
        names = set(z.namelist())
    on_disk = {str(p.relative_to(tmp_path / "d")) for p in (tmp_path / "d").rglob("*") if p.is_file()}
    assert names == on_disk == {"manifest.json", "program.py", "notes/data.bin"}


def test_save_is_atomic_over_an_existing_artifact(tmp_path, monkeypatch):
    _save(tmp_path / "z.kiln")
    before = (tmp_path / "z.kiln").read_bytes()
    import kiln.runtime.container as container

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(container.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _save(tmp_path / "z.kiln")
    assert (tmp_path / "z.kiln").read_bytes() == before  # the old artifact is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z.kiln"]  # no temp files left
    shutil.rmtree(tmp_path)


def test_zip_entries_are_stored(tmp_path):
    """Reading needs no inflate (part of a new machine's load)."""
    _save(tmp_path / "z.kiln")
    with zipfile.ZipFile(tmp_path / "z.kiln") as z:
        infos = z.infolist()
    assert {i.filename for i in infos} == {"manifest.json", "program.py", "notes/data.bin"}
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)


def test_a_fresh_process_reads_a_zip_artifact_without_the_cp437_codec(tmp_path):
    import subprocess
    import sys

    _save(tmp_path / "z.kiln")
    code = ("import sys; from kiln.runtime import load_artifact; "
            f"load_artifact({str(tmp_path / 'z.kiln')!r}); print('encodings.cp437' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_deflated_zip_artifact_still_loads(tmp_path):
    """Artifacts written before entries were stored (deflated, cp437 names) read as before."""
    w, x = _save(tmp_path / "d", fmt="dir")
    with zipfile.ZipFile(tmp_path / "old.kiln", "w", compression=zipfile.ZIP_DEFLATED) as z:
        for p in sorted((tmp_path / "d").rglob("*")):
            if p.is_file():
                z.writestr(str(p.relative_to(tmp_path / "d")), p.read_bytes())
    with zipfile.ZipFile(tmp_path / "old.kiln") as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    fn = load_compiled_function(tmp_path / "old.kiln")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("cafX.txt", b"x")
    # a name that is not UTF-8 (a cp437 zip from elsewhere): an ArtifactError, not a UnicodeDecodeError
    (tmp_path / "other.zip").write_bytes((tmp_path / "other.zip").read_bytes().replace(b"cafX", b"caf\x82"))
    with pytest.raises(ArtifactError, match="not a valid kiln artifact"):
        load_artifact(tmp_path / "other.zip")
    torch.testing.assert_close(fn(w, x)[0], x @ w)
