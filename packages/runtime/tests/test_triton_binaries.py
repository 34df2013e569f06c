"""Triton binaries in artifacts: found for the program's kernels, installed into Triton's cache when
they fit, left out (Triton rebuilds from source, with a log line) when they do not.

The CPU tests use Triton's on-disk layout with stand-in compiled kernels; the GPU test compiles a
real kernel with kiln's inductor and loads it in a fresh process with an empty Triton cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import kiln.runtime.checks as checks
from kiln.graph import PortableProgram, TensorSpec
from kiln.runtime import load_compiled_function, save_artifact, triton_module_name
from kiln.runtime.triton_binaries import (
    collect_triton_binaries,
    install_triton_binaries,
)

KERNELS = "import triton\n\n@triton.jit\ndef k0(x):\n    pass\n"
MODULES = (triton_module_name(KERNELS),)  # what a program declares it imports (PortableProgram.triton_modules)


def _fake_triton_cache(root: Path, key: str = "ABCDEF234567") -> tuple[Path, object]:
    """A Triton cache folder for one kernel, and a stand-in for its CompiledKernel."""
    folder = root / key
    folder.mkdir(parents=True)
    group = {}
    for name, data in (("k0.cubin", b"\x7fELF-binary"), ("k0.json", b'{"name": "k0"}'),
                       ("k0.ptx", b"// ptx")):
        (folder / name).write_bytes(data)
        group[name] = str(folder / name)
    (folder / "__grp__k0.json").write_text(json.dumps({"child_paths": group}))
    return folder, types.SimpleNamespace(metadata_group=group)


def _kernel_module(kernel: object) -> dict[str, object]:
    jit = types.SimpleNamespace(device_caches={0: ({"key": kernel}, None, None, None, None)})
    module = types.SimpleNamespace(k0=jit, helper=3)
    return {triton_module_name(KERNELS): module}


def test_collect_takes_the_kernels_cache_folder(tmp_path: Path) -> None:
    folder, kernel = _fake_triton_cache(tmp_path / "triton")
    files = collect_triton_binaries(MODULES, _kernel_module(kernel))
    assert sorted(files) == [f"triton/{folder.name}/{n}" for n in
                             ("__grp__k0.json", "k0.cubin", "k0.json", "k0.ptx")]
    assert files[f"triton/{folder.name}/k0.cubin"] == b"\x7fELF-binary"
    assert collect_triton_binaries(MODULES, {}) == {}  # kernels never loaded: nothing to ship
    assert collect_triton_binaries((), _kernel_module(kernel)) == {}  # a program that declares none


def test_install_writes_folders_with_their_group_pointing_there(tmp_path: Path) -> None:
    folder, kernel = _fake_triton_cache(tmp_path / "built")
    files = collect_triton_binaries(MODULES, _kernel_module(kernel))
    target = tmp_path / "other-machine-cache"
    assert install_triton_binaries(files, cache_dir=target) == 1
    group = json.loads((target / folder.name / "__grp__k0.json").read_text())
    assert group["child_paths"]["k0.cubin"] == str(target / folder.name / "k0.cubin")
    assert (target / folder.name / "k0.cubin").read_bytes() == b"\x7fELF-binary"
    # installed again (a second load): kept as it is
    assert install_triton_binaries(files, cache_dir=target) == 1


def _artifact_with_binaries(tmp_path: Path) -> Path:
    _, kernel = _fake_triton_cache(tmp_path / "built")
    binaries = collect_triton_binaries(MODULES, _kernel_module(kernel))
    program = PortableProgram("def call(args):\n    return (args[0] + 1,)\n", binaries)
    path = tmp_path / "f.kiln"
    save_artifact(path, program, input_names=["x"],
                  input_specs=[TensorSpec.from_tensor(torch.zeros(3))])
    return path


@pytest.mark.parametrize("fits", [True, False])
def test_load_installs_only_binaries_that_fit(tmp_path: Path, monkeypatch, caplog, fits: bool) -> None:
    path = _artifact_with_binaries(tmp_path)
    target = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(target))  # read on use (triton's knobs, kiln.runtime.knobs)
    if fits:  # as on the GPU that built it: same capability and triton release
        monkeypatch.setattr(checks, "_triton_binaries_fit", lambda m: True)
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        fn = load_compiled_function(path)
    torch.testing.assert_close(fn(torch.ones(3))[0], torch.full((3,), 2.0))
    installed = sorted(os.listdir(target)) if target.exists() else []
    if fits:
        assert installed == ["ABCDEF234567"] and "installed into" in caplog.text
    else:  # this CPU machine records no GPU capability: Triton will rebuild from source
        assert installed == [] and "recompiles the kernels from source" in caplog.text


GPU_CHILD = textwrap.dedent('''
    import os, sys, torch
    from kiln.runtime import load_compiled_function
    fn = load_compiled_function(sys.argv[1])
    x = torch.load(sys.argv[2])
    cache = os.environ["TRITON_CACHE_DIR"]
    before = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
    out = fn(x)
    torch.cuda.synchronize()
    new = sorted(set(os.listdir(cache)) - set(before))
    # every kernel came from the artifact: Triton compiled no kernel (it may build its own C launcher)
    compiled = [(d, f) for d in new for f in os.listdir(os.path.join(cache, d)) if f.endswith(".cubin")]
    assert before and not compiled, (before, compiled)
    torch.testing.assert_close(out, x.sin() * 2 + x.cos())
    print("OK", len(before))
''')


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the Triton interpreter compiles no binaries; run without TRITON_INTERPRET")
def test_gpu_artifact_ships_binaries_and_loads_without_compiling(tmp_path: Path) -> None:
    kiln = pytest.importorskip("kiln.api")

    def f(x):
        return x.sin() * 2 + x.cos()

    x = torch.randn(1000, device="cuda")
    compiled = kiln.compile(f, fullgraph=True, backend="inductor").aot_compile(((x,), {}))
    path = tmp_path / "f.kiln"
    compiled.save_compiled_function(path)
    shipped = [n for n in compiled.artifact.files if n.startswith("triton/")] \
        if compiled.artifact is not None else []
    torch.save(x, tmp_path / "x.pt")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "fresh-triton-cache"),
               KILN_CACHE_DIR=str(tmp_path / "kiln-cache"))
    proc = subprocess.run([sys.executable, "-c", GPU_CHILD, str(path), str(tmp_path / "x.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert shipped, "the artifact carries no Triton binaries"
    import triton
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) <= (3, 6):  # per-signature C launchers
        assert any(n.endswith(".so") for n in shipped), shipped


def test_launcher_modules_triton_built_are_shipped_and_installed(tmp_path, monkeypatch):
    """triton <= 3.6 builds a C launcher per kernel signature (and its driver helpers) into its cache
    with gcc; the artifact carries those .so files under the same cache key, and a load puts them back
    (a new machine then runs no host compiler). Files outside triton's cache are not shipped."""
    import types

    from kiln.runtime import triton_binaries as tb

    cache = tmp_path / "cache"
    so = cache / "abc123" / "__triton_launcher.cpython-3x.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF launcher")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    module = types.SimpleNamespace(__file__=str(so))
    launch = types.SimpleNamespace(__self__=module)  # a builtin's __self__ is its module
    owner = types.SimpleNamespace(launch=launch)
    files = tb._host_module_files(owner, "launch")
    assert files == {"triton/abc123/__triton_launcher.cpython-3x.so": b"\x7fELF launcher"}
    elsewhere = types.SimpleNamespace(launch=types.SimpleNamespace(
        __self__=types.SimpleNamespace(__file__=str(tmp_path / "pkg" / "x.so"))))
    assert tb._host_module_files(elsewhere, "launch") == {}
    assert tb._host_module_files(types.SimpleNamespace(launch=len), "launch") == {}  # no file: nothing

    target = tmp_path / "other"
    assert tb.install_triton_binaries(files, cache_dir=target) == 1
    assert (target / "abc123" / "__triton_launcher.cpython-3x.so").read_bytes() == b"\x7fELF launcher"
    assert tb.install_triton_binaries(files, cache_dir=target) == 1  # already there: kept
