"""Compiled Triton kernels handed to triton's in-memory cache at load (triton_preload.py).

Real CUDA binaries are made here without a GPU: the kernel is cross-compiled for cuda:90 through
triton's own ``warmup`` path with a driver that only names the target (as kiln's compile workers do).
The "load" re-imports the kernel module as a new process would (fresh JIT functions, empty kernel
caches) with the binaries installed into an empty Triton cache directory; only the driver step of a
launch (``CompiledKernel._init_handles``: loading the cubin into a CUDA context) is replaced.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from runtime_testlib import TargetOnlyDriver, needs_compiled_triton, target_only_driver  # noqa: E402

pytestmark = needs_compiled_triton

from kiln.runtime import triton_module_name  # noqa: E402
from kiln.runtime import triton_preload as tp  # noqa: E402
from kiln.runtime.triton_binaries import (  # noqa: E402
    collect_triton_binaries,
    install_triton_binaries,
)
from kiln.runtime.triton_notes import KERNEL_NOTES  # noqa: E402

KERNELS = '''import triton
import triton.language as tl


@triton.jit
def add_one(in_ptr0, out_ptr0, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x) + 1.0)
'''
MODULE = triton_module_name(KERNELS)
TARGET = ("cuda", 90, 32)


@pytest.fixture
def target_driver(monkeypatch, tmp_path):
    with target_only_driver(monkeypatch, tmp_path / "build-cache", TARGET):
        yield
    sys.modules.pop(MODULE, None)


def _import_kernels(folder: Path, name: str = MODULE, source: str = KERNELS):
    """The kernel module as a process imports it (the wrapper's loader: same name, new objects)."""
    sys.modules.pop(name, None)
    path = folder / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    tp.adopt_module(module)  # what the wrapper's loader does after the import
    return module


def _warmup(fn, xblock: int = 128):
    return fn.warmup(torch.float32, torch.float32, grid=(1,), XBLOCK=xblock, num_warps=4, num_stages=1)


def _saved(tmp_path: Path) -> tuple[dict[str, bytes], object]:
    """Compile in a 'saving process' and collect what an artifact carries."""
    module = _import_kernels(tmp_path / "src-save")
    kernel = _warmup(module.add_one)
    files = collect_triton_binaries((MODULE,))
    sys.modules.pop(MODULE)  # the saving process is gone
    return files, kernel


def _records(files: dict[str, bytes]) -> dict:
    names = [n for n in files if n.startswith(tp.RECORDS_PREFIX)]
    assert len(names) == 1, sorted(files)
    return json.loads(files[names[0]])


def test_records_carry_what_triton_needs_as_json(target_driver, tmp_path: Path) -> None:
    files, kernel = _saved(tmp_path)
    doc = _records(files)
    assert doc["triton"] == triton.__version__ and doc["format"] == tp.FORMAT
    (rec,) = doc["kernels"]
    assert rec["module"] == MODULE and rec["function"] == "add_one" and rec["target"] == list(TARGET)
    assert rec["hash"] == kernel.hash and rec["key"].startswith("[('*fp32', 'D'), ('*fp32', 'D'), ('constexpr', 128)]")
    assert rec["signature"]["in_ptr0"] == "*fp32" and rec["signature"]["XBLOCK"] == "constexpr"
    assert [[2], 128] in rec["constants"]
    # every file of the kernel's metadata group is shipped under its cache folder
    assert all(f"triton/{rec['folder']}/{name}" in files for name in rec["files"].values())


def test_load_hands_the_binary_to_triton_without_a_cache_lookup(target_driver, tmp_path: Path, caplog) -> None:
    files, saved = _saved(tmp_path)
    fresh = tmp_path / "fresh-triton-cache"  # a new machine: nothing in triton's cache
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        assert install_triton_binaries(files, "test artifact", cache_dir=fresh) == 1
        assert MODULE in tp.pending_modules()  # until the program imports its kernel module
        with tp.count_triton_work() as work:
            module = _import_kernels(tmp_path / "src-load")
            kernel = _warmup(module.add_one)  # the same specialisation a launch computes
    assert (work.cache_lookups, work.triton_key, work.host_builds) == (0, 0, 0), work.as_text()
    assert kernel is not saved and kernel.hash == saved.hash
    assert kernel.asm["cubin"] == saved.asm["cubin"] and kernel.metadata == saved.metadata
    assert str(fresh) in kernel.metadata_group[f"{saved.name}.json"]
    assert KERNEL_NOTES.preloaded(module.add_one) and not hasattr(module.add_one, "_kiln_preloaded")
    assert "1 compiled Triton kernel(s)" in caplog.text and "no cache lookup" in caplog.text


def test_launch_runs_the_preloaded_binary(target_driver, tmp_path: Path, monkeypatch) -> None:
    """triton's own launch path finds the kernel by its key and launches it; only loading the cubin
    into a CUDA context (``_init_handles``) is a stand-in here."""
    files, saved = _saved(tmp_path)
    install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
    module = _import_kernels(tmp_path / "src-load")
    launched = []

    def init_handles(self):
        if self._run is None:
            self.module, self.function = "module", f"function:{self.hash}"
            self._run = lambda *a: launched.append(a)
    monkeypatch.setattr(type(saved), "_init_handles", init_handles)
    x, y = torch.zeros(256), torch.zeros(256)
    with tp.count_triton_work() as work:
        module.add_one[(2, 1, 1)](x, y, XBLOCK=128, num_warps=4, num_stages=1)
    assert work.cache_lookups == 0, work.as_text()
    (args,) = launched
    assert args[:5] == (2, 1, 1, 0, f"function:{saved.hash}") and args[-3] is x and args[-2] is y and args[-1] == 128


def test_preloaded_kernel_needs_the_launcher_the_artifact_carries(target_driver, tmp_path: Path) -> None:
    """triton <= 3.6 builds a C launcher per kernel signature, found in its cache by the launcher's
    source: the kernel rebuilt from the records must generate exactly the saved kernel's source, so
    the launcher the artifact ships is the one found (no gcc on the new machine)."""
    nvidia = pytest.importorskip("triton.backends.nvidia.driver")
    if not hasattr(nvidia, "make_launcher"):
        pytest.skip("this triton launches every kernel through one generic launcher")
    files, saved = _saved(tmp_path)
    install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
    module = _import_kernels(tmp_path / "src-load")
    (loaded,) = module.add_one.device_caches[0][0].values()

    def launcher_source(kernel) -> str:  # what CudaLauncher.__init__ hands to make_launcher
        src = kernel.src
        constants = {(src.fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
        return nvidia.make_launcher(constants, dict(src.signature), getattr(kernel.metadata, "tensordesc_meta", None))
    assert launcher_source(loaded) == launcher_source(saved)


# A LayerNorm row kernel as kiln generates it for GPT-2 (the residual sum's LayerNorm in front of an addmm,
# one function shared by every layer): five bf16 pointers, two constexprs -- the launcher signature that
# the H200 load still built with gcc (k18_native_layer_norm_addmm, runtime.md "Session 8 -- GPU load 2").
LN_KERNELS = '''import triton
import triton.language as tl


@triton.jit
def k18_native_layer_norm_addmm(ptr_buf0, ptr_buf1, ptr_arg0, ptr_arg1, ptr_buf2, XBLOCK: tl.constexpr,
                                RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    x = (tl.load(ptr_buf0 + (rindex + RBLOCK * xindex)).to(tl.float32)
         + tl.load(ptr_buf1 + (rindex + RBLOCK * xindex)).to(tl.float32))
    mean = tl.sum(x, 1)[:, None] / RBLOCK
    d = x - mean
    var = tl.sum(d * d, 1)[:, None] / RBLOCK
    y = d * tl.rsqrt(var + 1e-5) * tl.load(ptr_arg0 + rindex).to(tl.float32) + tl.load(ptr_arg1 + rindex).to(tl.float32)
    tl.store(ptr_buf2 + (rindex + RBLOCK * xindex), y.to(tl.bfloat16))
'''
LN_MODULE = triton_module_name(LN_KERNELS)


def _import_ln(folder: Path):
    return _import_kernels(folder, LN_MODULE, LN_KERNELS)


@pytest.fixture
def launcher_builds(monkeypatch):
    """triton 3.6's own launcher path (``CudaLauncher`` -> ``make_launcher`` -> ``compile_module_from_src``,
    its cache lookup by the source's key) with only what needs CUDA replaced: the host compiler writes a
    stand-in file, libcuda's folder is not searched, a found module is not dlopen'ed. Yields the list of
    builds (sources compiled)."""
    nvidia = pytest.importorskip("triton.backends.nvidia.driver")
    if not hasattr(nvidia, "make_launcher"):
        pytest.skip("this triton launches every kernel through one generic launcher (no per-signature build)")
    import triton.runtime.build as build
    from triton import knobs

    builds: list[str] = []

    def host_compiler(name, src, srcdir, library_dirs, include_dirs, libraries):
        builds.append(Path(src).read_text())
        out = Path(srcdir) / f"{name}.so"
        out.write_bytes(b"stand-in launcher for " + hashlib.sha256(builds[-1].encode()).hexdigest().encode())
        return str(out)
    monkeypatch.setattr(knobs.build, "impl", host_compiler)
    monkeypatch.setattr(nvidia, "library_dirs", lambda: [])
    monkeypatch.setattr(build, "_load_module_from_path", lambda name, path: types.SimpleNamespace(
        __file__=path, launch=lambda *a: None))
    yield nvidia, builds
    sys.modules.pop(LN_MODULE, None)


def test_layer_norm_kernel_ships_the_launcher_a_load_builds(target_driver, launcher_builds, tmp_path: Path,
                                                            monkeypatch) -> None:
    """The saving process compiled the LayerNorm kernel through ``warmup`` (compile workers, the wrapper's
    precompile) and its C launcher was built into triton's cache by another kernel object of that
    signature (a compile worker, ``_kiln_prebuild_launchers``), so this kernel object has no launcher of
    its own (``_run`` None) and no driver here builds one: the artifact must still carry the launcher
    file the load's ``CudaLauncher`` looks up -- before this fix it shipped none and the load ran gcc."""
    nvidia, builds = launcher_builds
    module = _import_ln(tmp_path / "src-save")
    saved = module.k18_native_layer_norm_addmm.warmup(*[torch.bfloat16] * 5, grid=(1,), XBLOCK=8, RBLOCK=1024,
                                                      num_warps=8, num_stages=1)
    assert list(saved.src.signature.values()) == ["*bf16"] * 5 + ["constexpr"] * 2
    nvidia.CudaLauncher(saved.src, saved.metadata)  # what the compile worker did: the .so is in the cache
    assert len(builds) == 1 and saved.__dict__.get("_run") is None
    files = collect_triton_binaries((LN_MODULE,))
    sys.modules.pop(LN_MODULE)  # the saving process is gone
    fresh = tmp_path / "fresh"
    install_triton_binaries(files, "test artifact", cache_dir=fresh)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
    builds.clear()
    module = _import_ln(tmp_path / "src-load")
    (loaded,) = module.k18_native_layer_norm_addmm.device_caches[0][0].values()
    with tp.count_triton_work() as work:
        nvidia.CudaLauncher(loaded.src, loaded.metadata)  # what the load's first launch does
    assert (work.host_builds, builds) == (0, []), work.as_text()


def test_save_builds_the_launcher_nobody_built(target_driver, launcher_builds, tmp_path: Path,
                                              monkeypatch) -> None:
    """On the GPU host (triton's CUDA driver made), a kernel compiled but never launched whose launcher is
    in no cache gets it built at save, from the source the load will compute: the load builds none."""
    from triton.runtime import driver

    nvidia, builds = launcher_builds

    class CudaDriver(TargetOnlyDriver):  # what kiln checks for "this process has triton's CUDA driver"
        launcher_cls = nvidia.CudaLauncher
    monkeypatch.setattr(driver, "_active", CudaDriver())
    module = _import_ln(tmp_path / "src-save")
    module.k18_native_layer_norm_addmm.warmup(*[torch.bfloat16] * 5, grid=(1,), XBLOCK=8, RBLOCK=1024,
                                              num_warps=8, num_stages=1)
    assert builds == []
    files = collect_triton_binaries((LN_MODULE,))
    assert len(builds) == 1 and sum(tp.LAUNCHER_NAME in n for n in files) == 1  # built once, shipped
    sys.modules.pop(LN_MODULE)
    fresh = tmp_path / "fresh"
    install_triton_binaries(files, "test artifact", cache_dir=fresh)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
    builds.clear()
    (loaded,) = _import_ln(tmp_path / "src-load").k18_native_layer_norm_addmm.device_caches[0][0].values()
    nvidia.CudaLauncher(loaded.src, loaded.metadata)
    assert builds == []


def test_load_names_a_preloaded_kernel_without_its_launcher(target_driver, launcher_builds, tmp_path: Path,
                                                            caplog) -> None:
    """When the artifact lacks a kernel's launcher (an artifact of an older kiln), the load says which
    kernel will build one at its first launch, with the folder triton will put it in."""
    module = _import_ln(tmp_path / "src-save")
    module.k18_native_layer_norm_addmm.warmup(*[torch.bfloat16] * 5, grid=(1,), XBLOCK=8, RBLOCK=1024,
                                              num_warps=8, num_stages=1)
    files = {n: d for n, d in collect_triton_binaries((LN_MODULE,)).items() if tp.LAUNCHER_NAME not in n}
    sys.modules.pop(LN_MODULE)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
        _import_ln(tmp_path / "src-load")
    assert "no C launcher for 1 preloaded Triton kernel(s)" in caplog.text
    assert "k18_native_layer_norm_addmm (launcher " in caplog.text


def test_other_specialisation_still_takes_triton_path(target_driver, tmp_path: Path) -> None:
    files, saved = _saved(tmp_path)
    install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
    module = _import_kernels(tmp_path / "src-load")
    with tp.count_triton_work() as work:
        other = _warmup(module.add_one, xblock=64)  # not in the artifact: triton compiles it
    assert work.cache_lookups == 1 and other.hash != saved.hash
    assert work.details == ["cache lookup: kernel add_one"]


@pytest.mark.parametrize("change", ["triton", "target", "missing file", "env", "corrupt"])
def test_records_that_do_not_fit_fall_back_with_a_log_line(target_driver, tmp_path: Path, caplog,
                                                           change: str) -> None:
    files, saved = _saved(tmp_path)
    name = next(n for n in files if n.startswith(tp.RECORDS_PREFIX))
    doc = _records(files)
    rec = doc["kernels"][0]
    if change == "triton":
        doc["triton"] = "0.0.1"
    elif change == "target":
        rec["target"] = ["cuda", 80, 32]
    elif change == "missing file":
        files = {n: d for n, d in files.items() if not n.endswith(".cubin")}
    elif change == "env":
        doc["env"] = {"TRITON_SOME_OPTION": "1"}
    files[name] = b"{not json" if change == "corrupt" else json.dumps(doc).encode()
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
        module = _import_kernels(tmp_path / "src-load")
    assert not module.add_one.device_caches[0][0]  # nothing preloaded
    assert "not preloaded" in caplog.text
    assert not KERNEL_NOTES.preloaded(module.add_one)


def test_registered_after_the_module_was_imported(target_driver, tmp_path: Path) -> None:
    files, saved = _saved(tmp_path)
    module = _import_kernels(tmp_path / "src-load")  # the program imported its kernels first
    assert not module.add_one.device_caches[0][0]
    install_triton_binaries(files, "test artifact", cache_dir=tmp_path / "fresh")
    assert MODULE not in tp.pending_modules()
    assert [k.hash for k in module.add_one.device_caches[0][0].values()] == [saved.hash]


def test_artifact_load_preloads_through_the_wrapper_loader(target_driver, tmp_path: Path, monkeypatch) -> None:
    """The whole load path: an artifact whose program imports its kernels with the generated wrappers'
    loader; load_compiled_function installs the binaries, and the loader's hook files them into
    triton's kernel cache before the program runs."""
    import kiln.runtime.checks as checks
    from kiln.graph import PortableProgram, TensorSpec
    from kiln.runtime import load_compiled_function, save_artifact

    wrapper = pytest.importorskip("kiln.inductor.codegen.triton.wrapper")
    files, saved = _saved(tmp_path)
    program = (f"import triton\n_TRITON_SOURCE = {KERNELS!r}\n{wrapper.LOADER}\n"
               "triton_kernels = _kiln_load_triton_module(_TRITON_SOURCE)\n\n"
               "def call(args):\n    return (args[0] + len(triton_kernels.add_one.device_caches[0][0]),)\n")
    path = tmp_path / "f.kiln"
    save_artifact(path, PortableProgram(program, files), input_names=["x"],
                  input_specs=[TensorSpec.from_tensor(torch.zeros(3))])
    monkeypatch.setattr(checks, "_triton_binaries_fit", lambda m: True)  # as on the GPU that built it
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh"))
    with tp.count_triton_work() as work:
        fn = load_compiled_function(path)
        out = fn(torch.zeros(3))[0]
    assert work.cache_lookups == 0, work.as_text()
    torch.testing.assert_close(out, torch.ones(3))  # one kernel in triton's cache when the program ran
    (kernel,) = sys.modules[MODULE].add_one.device_caches[0][0].values()
    assert kernel.hash == saved.hash and str(tmp_path / "fresh") in kernel.metadata_group[f"{saved.name}.cubin"]
    assert list(kernel.src.signature) == list(saved.src.signature)  # positional order kept


def test_count_triton_work_counts_and_restores() -> None:
    import triton.runtime.build as build
    import triton.runtime.cache as cache
    before = (cache.triton_key, build._build)
    with tp.count_triton_work() as work:
        cache.triton_key()
    assert work.triton_key == 1
    assert (cache.triton_key, build._build) == before


# ---- GPU: a small GPT-2 saved on CUDA, loaded in a new process with empty caches ----------------

GPT2_CHILD = '''
import json, os, sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
from kiln.runtime import load_compiled_function, triton_preload
data = torch.load(sys.argv[2])
model = GPT2LMHeadModel(GPT2Config(**data["config"], **data["fixed"])).cuda().eval()
model.load_state_dict(data["state"])
torch.cuda.synchronize()
with torch.no_grad(), triton_preload.count_triton_work() as load_work:
    t0 = time.perf_counter()
    loaded = load_compiled_function(sys.argv[1])
    t1 = time.perf_counter()
    with triton_preload.count_triton_work() as call_work:
        out = loaded(model, data["ids"])
        torch.cuda.synchronize()
    t2 = time.perf_counter()
logits = out[0] if isinstance(out, (tuple, list)) else out.logits
torch.testing.assert_close(logits, data["expected"], rtol=1e-5, atol=1e-5)  # the same kernels (cuBLAS may pick another algorithm)
print(json.dumps({"load": load_work.__dict__, "first_call": call_work.__dict__,
                  "load_s": t1 - t0, "first_call_s": t2 - t1}))
'''


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the Triton interpreter compiles no binaries; run without TRITON_INTERPRET")
def test_gpu_gpt2_artifact_loads_without_triton_lookup_or_gcc(tmp_path: Path) -> None:
    """Save a 2-layer GPT-2 compiled on CUDA; a new process with empty KILN/TRITON caches (a new machine)
    loads it and runs it: the same logits, and no triton cache lookup (so no ``triton_key``) and no
    gcc build, neither while loading nor in the first call."""
    import subprocess

    kiln = pytest.importorskip("kiln.api")
    transformers = pytest.importorskip("transformers")
    config = dict(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=64)
    fixed = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="sdpa",
                 bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config, **fixed)).cuda().eval()
    ids = torch.randint(0, 512, (2, 32), device="cuda")
    with torch.no_grad():
        compiled = kiln.compile(model, fullgraph=True, backend="inductor").forward.aot_compile(((ids,), {}))
        out = compiled(model, ids)
        expected = (out[0] if isinstance(out, (tuple, list)) else out.logits).clone()
        eager = model(ids).logits
    torch.testing.assert_close(expected, eager, rtol=1e-3, atol=1e-3)
    path = tmp_path / "gpt2.kiln"
    compiled.save_compiled_function(path)
    shipped = sorted(compiled.artifact.files) if compiled.artifact is not None else []
    assert any(n.startswith(tp.RECORDS_PREFIX) for n in shipped), shipped[:20]
    torch.save({"config": config, "fixed": fixed, "state": model.state_dict(), "ids": ids, "expected": expected},
               tmp_path / "data.pt")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "fresh-triton"), KILN_CACHE_DIR=str(tmp_path / "fresh-kiln"))
    proc = subprocess.run([sys.executable, "-c", GPT2_CHILD, str(path), str(tmp_path / "data.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(report)
    for phase in ("load", "first_call"):
        counts = {k: report[phase][k] for k in ("cache_lookups", "triton_key", "host_builds")}
        assert counts == {"cache_lookups": 0, "triton_key": 0, "host_builds": 0}, (phase, report)


WARM_CHILD = '''
import json, sys, torch
from torch import nn
import kiln.api as kiln
from kiln.runtime import triton_preload
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64)).cuda().eval()
x = torch.randn(8, 64, device="cuda")
with torch.no_grad(), triton_preload.count_triton_work() as work:
    out = kiln.compile(model, backend="inductor")(x)
    torch.cuda.synchronize()
torch.save(out.cpu(), sys.argv[1])
print(json.dumps({k: v for k, v in work.__dict__.items()}))
'''


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the Triton interpreter compiles no binaries; run without TRITON_INTERPRET")
def test_gpu_warm_start_hands_cached_kernels_to_triton(tmp_path: Path) -> None:
    """kiln's graph cache on a warm start (a second process, same machine): the entry's kernels are
    handed to triton as an artifact's are, so the warm process makes no triton cache lookup."""
    import subprocess

    pytest.importorskip("kiln.api")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_CACHE_DIR=str(tmp_path / "kiln"))
    reports = []
    for run in ("cold", "warm"):
        proc = subprocess.run([sys.executable, "-c", WARM_CHILD, str(tmp_path / f"{run}.pt")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(reports)
    cold, warm = reports
    assert cold["cache_lookups"] > 0  # the cold process compiled (or looked up) its kernels
    # (triton_key may still be computed by the compile pool's background thread: not a lookup)
    assert warm["cache_lookups"] == 0 and warm["host_builds"] == 0, warm
    torch.testing.assert_close(torch.load(tmp_path / "warm.pt"), torch.load(tmp_path / "cold.pt"), rtol=1e-5, atol=1e-5)
