"""The graph-level cache: key soundness, hits load the stored program, bad entries are rebuilt."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import fx

from kiln.graph import CompiledGraph
from kiln.runtime import CompileCache, GraphCache, Uncacheable, cached_backend, graph_key
from kiln.runtime.graph_cache import NAMESPACE, decode_entry, encode_entry
from kiln.runtime.portable import program_from_graph_module


def _gm(scale: float = 2.0) -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, x, w):
            return (torch.relu(x @ w) * scale, x.sum())
    return fx.symbolic_trace(M())


def _inputs(n: int = 4) -> list[torch.Tensor]:
    return [torch.randn(n, 3), torch.randn(3, 5)]


class CountingBackend:
    """A backend whose compiled graphs carry a portable program (the FX graph as source)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: fx.GraphModule, example_inputs) -> CompiledGraph:
        self.calls += 1
        return CompiledGraph(gm.forward, "counting", {"graph": gm.code},
                             program_from_graph_module(gm))


def _key(gm, inputs, **kw) -> str:
    return graph_key(gm, inputs, backend=kw.pop("backend", "b"), options=kw.pop("options", ()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_key_names_the_gpus_compute_capability() -> None:
    """Kernels for sm_90 wait with griddepcontrol, which an sm_80 GPU sharing the cache cannot compile."""
    from kiln.runtime.graph_cache import _gpus

    xs = [t.cuda() for t in _inputs()]
    major, minor = torch.cuda.get_device_capability(0)
    assert _gpus(xs) == [f"cuda:0 sm_{major}{minor}"] and _gpus(_inputs()) == []
    assert _key(_gm(), xs) != _key(_gm(), _inputs())


def test_key_is_stable_and_sees_what_changes_the_result() -> None:
    gm, xs = _gm(), _inputs()
    base = _key(gm, xs)
    assert _key(_gm(), [t.clone() for t in xs]) == base  # values of inputs are not in the key
    assert _key(_gm(3.0), xs) != base  # graph code (a constant)
    assert _key(gm, _inputs(5)) != base  # shape
    assert _key(gm, [xs[0].double(), xs[1]]) != base  # dtype
    assert _key(gm, [xs[0].t().contiguous().t(), xs[1]]) != base  # stride
    assert _key(gm, [xs[0].requires_grad_(True), xs[1]]) != base  # requires_grad
    xs[0].requires_grad_(False)
    assert _key(gm, xs, backend="other") != base
    assert _key(gm, xs, options=("mode", "max-autotune")) != base
    with torch.no_grad():
        assert _key(gm, xs) != base  # grad mode
    with torch.autocast("cpu"):
        assert _key(gm, xs) != base  # autocast
    base, other = torch.randn(20), torch.randn(20)  # inputs sharing storage vs not
    aliased = [base[:12].view(4, 3), base[5:20].view(3, 5)]
    assert _key(gm, aliased) != _key(gm, [base[:12].view(4, 3), other[5:20].view(3, 5)])


def test_constants_are_hashed_by_value() -> None:
    class M(torch.nn.Module):
        def __init__(self, v: float) -> None:
            super().__init__()
            self.register_buffer("c", torch.full((3,), v))

        def forward(self, x):
            return (x + self.c,)
    x = [torch.randn(2, 3)]
    assert _key(fx.symbolic_trace(M(1.0)), x) != _key(fx.symbolic_trace(M(2.0)), x)


def _user_fn(x):
    return x * 3


fx.wrap("_user_fn")


def test_graph_calling_user_code_is_not_cacheable(tmp_path: Path, caplog) -> None:
    gm = fx.symbolic_trace(lambda x: (_user_fn(x),))
    with pytest.raises(Uncacheable, match="_user_fn"):
        _key(gm, [torch.randn(3)])
    counting = CountingBackend()
    backend = cached_backend(counting, "b", (), cache=CompileCache(tmp_path))
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        backend(gm, [torch.randn(3)])
        backend(gm, [torch.randn(3)])
    assert counting.calls == 2
    assert "graph cache bypass" in caplog.text


def test_miss_then_hit_runs_the_stored_program(tmp_path: Path, caplog) -> None:
    gm, xs = _gm(), _inputs()
    counting = CountingBackend()
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        first = cached_backend(counting, "b", (), cache=CompileCache(tmp_path))(gm, xs)
        # a new wrapper and a new cache object over the same folder: what a second process sees
        second = cached_backend(counting, "b", (), cache=CompileCache(tmp_path))(_gm(), xs)
    assert counting.calls == 1
    assert "graph cache miss" in caplog.text and "graph cache hit" in caplog.text
    assert second.backend == "counting" and second.texts["graph"] == gm.code
    fresh = _inputs()
    expected = gm(*fresh)
    for got in (first(*fresh), second(*fresh)):
        torch.testing.assert_close(tuple(got), tuple(expected))
    # another shape is another entry
    cached_backend(counting, "b", (), cache=CompileCache(tmp_path))(gm, _inputs(7))
    assert counting.calls == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_value"])
def test_corrupt_entries_are_rebuilt(tmp_path: Path, damage: str, caplog) -> None:
    gm, xs = _gm(), _inputs()
    counting = CountingBackend()
    store = CompileCache(tmp_path)
    cached_backend(counting, "b", (), cache=store)(gm, xs)
    (entry,) = [p for p in (tmp_path / "v1" / "entries" / NAMESPACE).rglob("*") if p.is_file()]
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        entry.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    else:  # a well-formed cache entry whose program does not run
        key = _key(gm, xs)
        store.put(NAMESPACE, key, b'{"format": "kiln-graph-cache/1", "backend": "x", "source": '
                  b'"raise RuntimeError(1)", "requires": [], "texts": {}, "files": []}\n')
    with caplog.at_level(logging.INFO, logger="kiln"):
        again = cached_backend(counting, "b", (), cache=CompileCache(tmp_path))(gm, xs)
    assert counting.calls == 2
    torch.testing.assert_close(tuple(again(*xs)), tuple(gm(*xs)))
    # rebuilt: the next lookup is a hit again
    cached_backend(counting, "b", (), cache=CompileCache(tmp_path))(gm, xs)
    assert counting.calls == 2


def test_entry_round_trip_with_files() -> None:
    program = program_from_graph_module(_gm(), extra_files={"lib/k.so": b"\x00\x01binary"})
    back = decode_entry(encode_entry(program, {"t": "text"}, "inductor"))
    assert back.program == program and back.texts == {"t": "text"} and back.backend == "inductor"
    with pytest.raises(ValueError):
        decode_entry(encode_entry(program, {}, "x")[:-3])


def test_disabled_cache_compiles_every_time(tmp_path: Path) -> None:
    counting = CountingBackend()
    backend = cached_backend(counting, "b", (), cache=CompileCache(tmp_path, enabled=False))
    backend(_gm(), _inputs())
    backend(_gm(), _inputs())
    assert counting.calls == 2
    assert GraphCache(CompileCache(tmp_path, enabled=False)).load("k") is None


def test_triton_binaries_join_the_entry_after_the_first_call_and_install_on_a_hit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A miss whose program has Triton kernels stores their binaries after its first call (Triton
    compiles on first launch); a hit installs them into Triton's cache, so nothing recompiles."""
    import kiln.runtime.graph_cache as gc_mod

    class TritonishBackend(CountingBackend):
        def __call__(self, gm, example_inputs):
            compiled = super().__call__(gm, example_inputs)
            p = compiled.portable
            # the program declares the Triton kernel module it imports (PortableProgram.triton_modules);
            # a backend's stage-private results (inductor: loop_program, autograd: aot) are kept
            return CompiledGraph(compiled.fn, "tritonish", compiled.texts,
                                 type(p)(p.source, p.files, p.requires, ("kiln_triton_abc",)), aot="kept")

    fake = {"triton/abc123/k.cubin": b"\x7fELF", "triton/abc123/__grp__k.json": b"{}"}
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(gc_mod, "collect_triton_binaries", lambda modules: asked.append(modules) or dict(fake))
    triton_dir = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
    store = CompileCache(tmp_path / "cache")
    xs = _inputs()
    backend = cached_backend(TritonishBackend(), "tritonish", None, cache=store)
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        first = backend(_gm(), xs)
        assert first.aot == "kept"
        first(*xs)  # the first call: kernels compiled, binaries added to the entry
        key = graph_key(_gm(), xs, backend="tritonish", options=None)
        entry = GraphCache(store).load(key)
        assert entry is not None and set(fake) <= set(entry.program.files)
        assert asked == [("kiln_triton_abc",)]  # the modules the program declares, not parsed from its source
        again = backend(_gm(), xs)  # a hit: binaries installed, not materialized with the program
    assert (triton_dir / "abc123" / "k.cubin").read_bytes() == b"\x7fELF"
    assert not any(n.startswith("triton/") for n in again.portable.files)
    torch.testing.assert_close(again(*xs), _gm()(*xs))
    assert any("Triton kernel(s) installed from the entry, none compiled" in r.getMessage()
               for r in caplog.records)


def test_source_hash_reads_files_only_after_a_change(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import os

    from kiln.runtime import graph_cache as gc_mod

    root = tmp_path / "src" / "kiln"
    (root / "stage").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "stage" / "b.py").write_text("B = 2\n")
    (root / "notes.txt").write_text("not source")
    cache = CompileCache(tmp_path / "cache")

    def by_content() -> str:
        h = hashlib.sha256()
        for rel in ("a.py", "stage/b.py"):
            h.update(rel.encode())
            h.update((root / rel).read_bytes())
        return h.hexdigest()

    reads: list[Path] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",
                        lambda self: (root in self.parents and reads.append(self)) or real(self))
    first = gc_mod.source_hash([str(root)], cache)
    assert first == by_content() and len(reads) == 2 + 2  # its own reads, then by_content's
    reads.clear()
    assert gc_mod.source_hash([str(root)], cache) == first
    assert reads == [], "an unchanged tree was read and hashed again"
    (root / "stage" / "b.py").write_text("B = 3\n")
    os.utime(root / "stage" / "b.py", ns=(1, 1))  # a new mtime, whatever the clock's resolution
    changed = gc_mod.source_hash([str(root)], cache)
    assert changed != first and changed == by_content()
