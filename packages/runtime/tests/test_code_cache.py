"""Code objects and guard checks reused from the compile cache: same behaviour, bad entries ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.graph import Guard, GuardSet, PortableProgram, TensorSpec, tensor_expectation
from kiln.runtime import CompileCache
from kiln.runtime.cache import using_cache
from kiln.runtime.code_cache import _CODE_NS, compile_cached, compile_guards, flush_code_writes


@pytest.fixture
def default_store(tmp_path: Path):
    """The process's default compile cache is a fresh one for the test."""
    with using_cache(CompileCache(tmp_path / "cache")) as store:
        yield store


def _guards() -> GuardSet:
    x = torch.randn(2, 3)
    return GuardSet((
        Guard("L['x']", "TENSOR_MATCH", tensor_expectation(x)),
        Guard("L['n']", "EQUALS_MATCH", 3),
        Guard("L['m']", "TYPE_MATCH", "torch.nn.modules.linear:Linear"),
        Guard("L['m'].weight", "TENSOR_MATCH", tensor_expectation(torch.nn.Linear(3, 3).weight)),
    ))


def _frames() -> tuple[dict, dict]:
    good = {"x": torch.randn(2, 3), "n": 3, "m": torch.nn.Linear(3, 3)}
    bad = [dict(good, x=torch.randn(3, 3)), dict(good, n=4), dict(good, n=3.0),
           dict(good, m=torch.nn.Linear(3, 4)), dict(good, x=torch.randn(2, 3, dtype=torch.float64))]
    return good, bad


def test_guard_check_and_gather() -> None:
    outs = ["L['x']", "L['m'].weight", "L['m'].bias"]
    good, bad = _frames()
    check, gather = compile_guards(_guards()), compile_guards(_guards(), outs)
    assert check(good, {}) is True and [check(b, {}) for b in bad] == [False] * len(bad)
    got = gather(good, {})
    assert got is not None and got[0] is good["x"] and got[1] is good["m"].weight
    assert got[2] is good["m"].bias
    assert [gather(b, {}) for b in bad] == [None] * len(bad)
    assert gather({"x": good["x"], "n": 3}, {}) is None  # a source that cannot be read fails


def test_corrupt_code_entries_are_regenerated(tmp_path: Path) -> None:
    store = CompileCache(tmp_path)
    compile_cached("y = 1 + 1\n", "<t>", store)
    assert flush_code_writes(10)
    for p in (tmp_path / "v1" / "entries" / _CODE_NS).rglob("*"):
        if p.is_file():
            p.write_bytes(p.read_bytes()[:-5])
    ns: dict = {}
    exec(compile_cached("y = 1 + 1\n", "<t>", store), ns)
    assert ns["y"] == 2


def test_compile_cached_reuses_code(tmp_path: Path) -> None:
    store = CompileCache(tmp_path)
    src = "def f(a):\n    return a * 2\n"
    a = compile_cached(src, "<f>", store)
    assert flush_code_writes(10)
    b = compile_cached(src, "<f>", store)
    assert a is not b and a == b  # the second one was unmarshalled
    ns: dict = {}
    exec(b, ns)
    assert ns["f"](4) == 8


def test_gc_is_paused_while_loading_and_restored(tmp_path) -> None:
    """A load allocates many long-lived objects: Python's cyclic GC is off during it, on after (also
    when the load fails), and stays off for a program that turned it off."""
    import gc

    from kiln.runtime import ArtifactError, load_compiled_function, save_artifact
    from kiln.runtime import loaded as loaded_mod

    seen: list[bool] = []
    real = loaded_mod.LoadedFunction.from_artifact

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)
    prog = PortableProgram("def call(args):\n    return (args[0] + 1,)\n", {})
    path = tmp_path / "a.kiln"
    save_artifact(path, prog, input_names=["x"], input_specs=[TensorSpec.from_tensor(torch.ones(2))])
    loaded_mod.LoadedFunction.from_artifact = staticmethod(spy)
    try:
        assert gc.isenabled()
        fn = load_compiled_function(str(path))
        assert seen == [False] and gc.isenabled()
        torch.testing.assert_close(fn(torch.ones(2))[0], torch.full((2,), 2.0))
        with pytest.raises(ArtifactError):
            load_compiled_function(b"not an artifact")
        assert gc.isenabled()
        gc.disable()
        try:
            load_compiled_function(str(path))
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        loaded_mod.LoadedFunction.from_artifact = real


def test_code_objects_are_written_off_the_loading_thread(tmp_path: Path, monkeypatch) -> None:
    """A load needs the code, not its cache entry: the entry is written by a background thread
    (flush_code_writes waits for it); until then the same process reuses the code it compiled."""
    import threading

    assert flush_code_writes(10)  # earlier tests' writes (the writer pauses before writing)
    release, writers = threading.Event(), []

    class SlowCache(CompileCache):
        def put(self, namespace, key, data):
            writers.append(threading.current_thread() is threading.main_thread())
            release.wait(10)
            return super().put(namespace, key, data)
    store = SlowCache(tmp_path)
    src = "def f(a):\n    return a + 3\n"
    a = compile_cached(src, "<bg>", store)  # returns while the write waits
    assert compile_cached(src, "<bg>", store) is a  # pending in this process: not compiled again
    assert not flush_code_writes(0.05)
    assert not [p for p in (tmp_path / "v1" / "entries").rglob("*") if p.is_file()]
    release.set()
    assert flush_code_writes(10) and writers == [False]
    b = compile_cached(src, "<bg>", store)
    assert b is not a and b == a  # read back from the cache


@pytest.mark.parametrize("first", ["call", "guard_failure"])
def test_a_load_writes_its_code_objects_after_the_first_call(tmp_path: Path, monkeypatch, first,
                                                            default_store: CompileCache) -> None:
    """The writer thread would take the GIL from the load and the first call (what a new machine
    waits on): a load queues its code objects and the writes start once the first call returns."""
    from kiln.runtime import GuardError, code_cache, load_compiled_function, save_artifact

    assert flush_code_writes(10)
    store = default_store
    prog = PortableProgram("def call(args):\n    return (args[0] * 5,)\n", {})
    path = tmp_path / "a.kiln"
    save_artifact(path, prog, input_names=["x"], input_specs=[TensorSpec.from_tensor(torch.ones(2))])
    fn = load_compiled_function(str(path), cache=store)
    assert code_cache.WRITER.pending and not code_cache.WRITER.running  # queued, not started
    if first == "call":
        torch.testing.assert_close(fn(torch.ones(2))[0], torch.full((2,), 5.0))
    else:
        with pytest.raises(GuardError):
            fn(torch.ones(3))
    assert not code_cache.WRITER.held
    assert flush_code_writes(10) and not code_cache.WRITER.pending
    assert [p for p in (tmp_path / "cache" / "v1" / "entries" / _CODE_NS).rglob("*") if p.is_file()]
    torch.testing.assert_close(fn(torch.ones(2))[0], torch.full((2,), 5.0))


def _entries(root: Path) -> list[Path]:
    return [p for p in (root / "v1" / "entries" / _CODE_NS).rglob("*") if p.is_file()]


def test_writes_after_a_first_call_wait_a_moment_unless_flushed(tmp_path: Path, monkeypatch,
                                                               default_store: CompileCache) -> None:
    """After a first call the writer pauses before it writes (what the program does next runs
    without it); a flush writes at once. The first call does not wait for the writer thread."""
    import threading
    import time

    from kiln.runtime import load_compiled_function, save_artifact
    from kiln.runtime.code_cache import CodeWriter

    assert flush_code_writes(10)
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self))  # none used
    prog = PortableProgram("def call(args):\n    return (args[0] * 7,)\n", {})
    save_artifact(tmp_path / "a.kiln", prog, input_names=["x"],
                  input_specs=[TensorSpec.from_tensor(torch.ones(2))])
    fn = load_compiled_function(str(tmp_path / "a.kiln"), cache=default_store)
    torch.testing.assert_close(fn(torch.ones(2))[0], torch.full((2,), 7.0))
    assert flush_code_writes(10) and _entries(tmp_path / "cache") and not started
    # the pause, on a writer of the test's own with a long one: released, it waits; a flush writes at once
    writer, own = CodeWriter(delay_s=60.0), CompileCache(tmp_path / "own")
    writer.hold()
    writer.write_later(own, "first", compile("x = 1\n", "<first>", "exec"))
    assert writer.pending and not writer.running  # held until the first call returns
    writer.release()
    time.sleep(0.3)
    assert writer.running and writer.pending and not _entries(tmp_path / "own")  # paused
    t0 = time.perf_counter()
    assert writer.flush(10) and not writer.pending
    assert time.perf_counter() - t0 < 10 and len(_entries(tmp_path / "own")) == 1
    # the next writer pauses again
    writer.write_later(own, "second", compile("y = 1\n", "<second>", "exec"))
    time.sleep(0.3)
    assert writer.pending and len(_entries(tmp_path / "own")) == 1
    assert writer.flush(10) and len(_entries(tmp_path / "own")) == 2


def test_a_process_that_exits_right_after_its_first_call_writes_its_code_objects(tmp_path: Path) -> None:
    """The exit flush cuts the writer's pause short: nothing is lost, every entry is whole."""
    import os
    import subprocess
    import sys

    from kiln.runtime import save_artifact

    prog = PortableProgram("def call(args):\n    return (args[0] * 7,)\n", {})
    save_artifact(tmp_path / "a.kiln", prog, input_names=["x"],
                  input_specs=[TensorSpec.from_tensor(torch.ones(2))])
    code = ("import torch, time; from kiln.runtime import load_compiled_function as load; "
            f"f = load({str(tmp_path / 'a.kiln')!r}); f(torch.ones(2)); t = time.perf_counter()")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    entries = _entries(tmp_path / "cache")
    assert entries and not [p for p in (tmp_path / "cache").rglob(".tmp*")]
    import json
    import marshal

    from kiln.runtime.cache import MAGIC

    store = CompileCache(tmp_path / "cache")
    for p in entries:  # each entry verifies (its checksum) and unmarshals
        raw = p.read_bytes()
        key = json.loads(raw[len(MAGIC):raw.index(b"\n", len(MAGIC))])["key"]
        data = store.get(_CODE_NS, key)
        assert data is not None and marshal.loads(data).co_filename
