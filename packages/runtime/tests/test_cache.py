"""The compile cache: round trips, 0700 permissions, corruption recovery, atomicity, concurrency."""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat
import time

import pytest

from kiln.runtime import CompileCache, cache_clear, cache_info_text
from kiln.runtime.cache import key_hash


def _entry(root, ns, key):
    h = key_hash(key)
    return root / "v1" / "entries" / ns / h[:2] / h


def test_round_trip_and_miss(cache_root):
    c = CompileCache(cache_root)
    assert c.get("code", "k1") is None
    assert c.put("code", "k1", b"hello")
    assert c.get("code", "k1") == b"hello"
    assert c.get("code", "k2") is None
    assert c.get("kernels", "k1") is None  # namespaces are separate
    c.put_json("autotune", "mm-128", {"BLOCK": 64, "warps": 4})
    assert c.get_json("autotune", "mm-128") == {"BLOCK": 64, "warps": 4}
    with pytest.raises(ValueError, match="invalid cache namespace"):
        c.get("Bad NS", "k")


def test_get_or_build_builds_once(cache_root):
    c = CompileCache(cache_root)
    calls = []

    def build():
        calls.append(1)
        return b"artifact"

    assert c.get_or_build("code", "k", build) == b"artifact"
    assert CompileCache(cache_root).get_or_build("code", "k", build) == b"artifact"
    assert len(calls) == 1


def test_private_permissions(cache_root):
    c = CompileCache(cache_root)
    c.put("code", "k", b"x")
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700
    entry = _entry(cache_root, "code", "k")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700


def test_loose_permissions_are_tightened(cache_root):
    cache_root.mkdir()
    os.chmod(cache_root, 0o755)
    CompileCache(cache_root).put("code", "k", b"x")
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "foreign", "empty"])
def test_corrupt_entries_are_ignored_and_rebuilt(cache_root, caplog, damage):
    c = CompileCache(cache_root)
    c.put("code", "k", b"the real data" * 10)
    c.put("code", "other", b"someone else's data")
    path = _entry(cache_root, "code", "k")
    raw = path.read_bytes()
    if damage == "flip":
        raw = raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:]
    elif damage == "truncate":
        raw = raw[:-7]
    elif damage == "garbage":
        raw = os.urandom(200)
    elif damage == "foreign":
        raw = _entry(cache_root, "code", "other").read_bytes()
    else:
        raw = b""
    path.write_bytes(raw)
    with caplog.at_level(logging.WARNING, logger="kiln.runtime.cache"):
        assert c.get("code", "k") is None
    assert "ignoring code entry" in caplog.text and "rebuilt" in caplog.text
    assert not path.exists()  # removed, so the rebuild can take its place
    assert c.get_or_build("code", "k", lambda: b"rebuilt") == b"rebuilt"
    assert c.get("code", "k") == b"rebuilt"


def test_unusable_root_degrades_to_no_cache(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    c = CompileCache(blocker / "cache")
    with caplog.at_level(logging.WARNING, logger="kiln.runtime.cache"):
        assert c.get_or_build("code", "k", lambda: b"built") == b"built"
    assert "not usable" in caplog.text
    assert c.get("code", "k") is None and not c.info().enabled
    assert c.materialize("cpp_lib", b"abc", ".so").read_bytes() == b"abc"  # scratch dir instead


def test_failed_write_leaves_no_entry_and_no_temp_file(cache_root, monkeypatch):
    c = CompileCache(cache_root)
    c.put("code", "warm", b"x")
    import kiln.runtime.cache as cache_mod

    def crash(*a, **k):
        raise OSError("simulated crash before publishing")

    monkeypatch.setattr(cache_mod.os, "replace", crash)
    assert c.put("code", "k", b"data") is False  # logged, not raised
    monkeypatch.undo()
    assert c.get("code", "k") is None
    leftovers = [p for p in (cache_root / "v1").rglob(".tmp-*")]
    assert leftovers == []


def test_info_and_clear(cache_root):
    c = CompileCache(cache_root)
    for i in range(3):
        c.put("code", f"k{i}", b"x" * 100)
    c.put("cpp_so", "lib", b"y" * 1000)
    info = c.info()
    assert info.entries == 4 and info.bytes > 1100
    assert info.namespaces["code"][0] == 3 and info.namespaces["cpp_so"][0] == 1
    text = cache_info_text(cache_root)
    assert "4 entries" in text and "cpp_so" in text
    assert c.clear("code") == 3
    assert c.get("code", "k0") is None and c.get("cpp_so", "lib") == b"y" * 1000
    assert "removed 1 files" in cache_clear(cache_root)
    assert c.info().entries == 0


def _fill(root: str, worker: int, start, keys: int) -> None:
    c = CompileCache(root)
    start.wait()
    order = list(range(keys))
    order = order[worker::2] + order[: worker] + order  # overlap heavily with the other workers
    for i in order:
        data = c.get_or_build("code", f"key{i}", lambda i=i: (f"value {i} ".encode() * (100 + i)))
        assert data == f"value {i} ".encode() * (100 + i), (worker, i)
        c.put("raw", f"key{i % 5}", bytes([worker]) * (1000 + 37 * worker))  # racing plain puts


def test_concurrent_processes_leave_a_valid_cache(cache_root):
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_fill, args=(str(cache_root), w, start, 30)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    c = CompileCache(cache_root)
    for i in range(30):
        assert c.get("code", f"key{i}") == f"value {i} ".encode() * (100 + i)
    for i in range(5):
        data = c.get("raw", f"key{i}")
        assert data is not None and data == bytes([data[0]]) * (1000 + 37 * data[0])  # one whole write
    assert c.info().namespaces["code"][0] == 30
    assert list((cache_root / "v1").rglob(".tmp-*")) == []


def test_cache_key_covers_the_environment():
    from kiln.runtime import cache_key

    assert cache_key("graph", "opts") == cache_key("graph", "opts")
    assert cache_key("graph", "opts") != cache_key("graph", "other opts")
    assert cache_key("ab", "c") != cache_key("a", "bc")  # parts are delimited
    assert len(cache_key(b"bytes too")) == 64


def test_warm_start_of_a_whole_artifact(cache_root, tmp_path):
    """The recipe for compiled functions: key -> artifact bytes -> load_compiled_function."""
    import torch

    from kiln.graph import PortableProgram
    from kiln.runtime import build_artifact, cache_key, load_compiled_function

    c = CompileCache(cache_root)
    builds = []

    def build():
        builds.append(1)
        return build_artifact(PortableProgram("def call(args):\n    return (args[0] * 2,)\n"),
                              input_names=["x"]).to_bytes()

    key = cache_key("graph text", "mode=default")
    for _ in range(2):
        fn = load_compiled_function(c.get_or_build("artifacts", key, build))
        assert fn(torch.ones(2))[0].tolist() == [2.0, 2.0]
    assert builds == [1]


def _build_slowly(root: str, log: str, start) -> None:
    def build() -> bytes:
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(0.5)  # a compile in progress: the other process must wait, not build again
        return b"compiled kernel"

    start.wait()
    assert CompileCache(root).get_or_build("cpp_so", "same-source", build) == b"compiled kernel"


def test_concurrent_builders_of_one_key_build_once(cache_root, tmp_path):
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    log = tmp_path / "builds.log"
    procs = [ctx.Process(target=_build_slowly, args=(str(cache_root), str(log), start)) for _ in range(3)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert log.read_text() == "built\n"
