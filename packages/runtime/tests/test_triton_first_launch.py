"""A warm start's first Triton launch binds the preloaded binary without triton's ``JITFunction.run``.

The wrappers' launcher (inductor codegen/triton/launcher.py) records, on each binary it launched, the
launch's description (constexprs, warps, stages, option knobs, and what triton specialises on per
argument); triton_preload saves it in the kernel's record and puts it back on the rebuilt kernel; a new
process's launcher whose first call is described the same way binds that binary directly. CPU only:
binaries are cross-compiled for sm_90 (as in test_triton_preload.py) and only the step loading a cubin
into a CUDA context (``CompiledKernel._init_handles``) is a stand-in. The GPU test at the end runs a
real warm start and compares with eager.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from runtime_testlib import needs_compiled_triton, target_only_driver  # noqa: E402

pytestmark = needs_compiled_triton

from kiln.inductor.codegen.triton.launcher import KilnLaunch  # noqa: E402
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
def scale_add(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x, mask=x < xnumel) * 2.0 + 1.0, mask=x < xnumel)
'''
MODULE = triton_module_name(KERNELS)
# the same kernel as kiln generates it for a symbolic size: declared i64 and never specialised on
FREE_KERNELS = KERNELS.replace("@triton.jit", '@triton.jit(do_not_specialize=["xnumel"])').replace(
    "xnumel, XBLOCK", 'xnumel: "i64", XBLOCK')
FREE_MODULE = triton_module_name(FREE_KERNELS)
CTX = (0, 7, False)  # (device, stream, inputs aligned) as the wrapper's _kiln_launch_context() gives them


@pytest.fixture
def cross(monkeypatch, tmp_path):
    """sm_90 compiles without a GPU; launches recorded instead of run; JITFunction.run counted."""
    from triton.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    launched: list[tuple] = []
    jit_runs: list[str] = []

    def init_handles(self):  # loading the cubin into a CUDA context: the only GPU step
        if self._run is None:
            self.module, self.function = "module", f"function:{self.hash}"
            self._run = lambda *a: launched.append(a)
    monkeypatch.setattr(CompiledKernel, "_init_handles", init_handles)
    original_run = JITFunction.run

    def counted_run(self, *args, **kwargs):
        jit_runs.append(self.__name__)
        return original_run(self, *args, **kwargs)
    monkeypatch.setattr(JITFunction, "run", counted_run)
    with target_only_driver(monkeypatch, tmp_path / "build-cache"):
        yield launched, jit_runs
    sys.modules.pop(MODULE, None)


def _import_kernels(folder: Path, source: str = KERNELS):
    """The kernel module as a new process imports it (the wrapper's loader: same name, new objects)."""
    name = triton_module_name(source)
    sys.modules.pop(name, None)
    path = folder / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    tp.adopt_module(module)
    return module


def _cold(tmp_path: Path, launched: list, xblock: int = 128) -> tuple[dict[str, bytes], object]:
    """A first process: the launcher compiles through triton's path and launches; the graph cache then
    collects the binaries with their records."""
    module = _import_kernels(tmp_path / "src-cold")
    launch = KilnLaunch(module.scale_add, {"XBLOCK": xblock}, 4, (0, 2))
    x, y = torch.zeros(300), torch.zeros(300)
    launch((3, 1, 1), CTX, x, y, 300)
    assert len(launched) == 1 and launch.run is not None
    files = collect_triton_binaries((MODULE,))
    (binary,) = module.scale_add.device_caches[0][0].values()
    sys.modules.pop(MODULE)
    launched.clear()
    return files, binary


def _warm(tmp_path: Path, files: dict[str, bytes]):
    install_triton_binaries(files, "test entry", cache_dir=tmp_path / f"fresh-{len(list(tmp_path.iterdir()))}")
    return _import_kernels(tmp_path / "src-warm")


def _record(files: dict[str, bytes]) -> dict:
    (name,) = [n for n in files if n.startswith(tp.RECORDS_PREFIX)]
    (rec,) = json.loads(files[name])["kernels"]
    return rec


def test_record_carries_the_launch_that_compiled_the_kernel(cross, tmp_path: Path) -> None:
    launched, _ = cross
    files, binary = _cold(tmp_path, launched)
    rec = _record(files)
    assert rec["launch"] == KERNEL_NOTES.launch(binary).as_data()  # noted beside the kernel, not on it
    assert not hasattr(binary, "_kiln_launch")
    consts, warps, stages, _knobs, specs = rec["launch"]
    assert (consts, warps, stages) == ([["XBLOCK", 128]], 4, 1)
    assert specs == [["T", "torch.float32", True], ["T", "torch.float32", True],
                     ["i", False, False, True, True]]


def test_first_warm_launch_binds_the_preloaded_binary_without_jit_run(cross, tmp_path: Path) -> None:
    launched, jit_runs = cross
    files, binary = _cold(tmp_path, launched)
    module = _warm(tmp_path, files)
    jit_runs.clear()
    launch = KilnLaunch(module.scale_add, {"XBLOCK": 128}, 4, (0, 2))
    x, y = torch.ones(300), torch.zeros(300)
    launch((3, 1, 1), CTX, x, y, 300)
    assert jit_runs == []  # no specialisation, no key, no kernel-cache lookup in triton
    (args,) = launched
    assert args[:5] == (3, 1, 1, 7, f"function:{binary.hash}")
    assert args[-4] is x and args[-3] is y and args[-2:] == (300, 128)
    launch((3, 1, 1), CTX, x, y, 300)  # later calls: the fast path, as after a cold first launch
    assert len(launched) == 2 and jit_runs == []


@pytest.mark.parametrize("change", ["misaligned", "size", "xblock", "warps", "debug knob", "no description"])
def test_a_launch_described_otherwise_takes_triton_path(cross, tmp_path: Path, change: str, monkeypatch) -> None:
    launched, jit_runs = cross
    files, _ = _cold(tmp_path, launched)
    if change == "no description":  # an entry written before launches were recorded
        (name,) = [n for n in files if n.startswith(tp.RECORDS_PREFIX)]
        doc = json.loads(files[name])
        del doc["kernels"][0]["launch"]
        files = {**files, name: json.dumps(doc).encode()}
    module = _warm(tmp_path, files)
    jit_runs.clear()
    if change == "debug knob":  # a launch option triton reads from its knobs, not from the arguments
        knobs = pytest.importorskip("triton.knobs")
        monkeypatch.setattr(knobs.runtime, "debug", True)
    x, y = torch.ones(301), torch.zeros(300)
    args = {"misaligned": (x[1:], y, 300), "size": (x[:300], y, 288)}.get(change, (x[:300], y, 300))
    launch = KilnLaunch(module.scale_add, {"XBLOCK": 64 if change == "xblock" else 128},
                        2 if change == "warps" else 4, (0, 2))
    launch((3, 1, 1), CTX, *args)
    assert jit_runs == ["scale_add"], change  # triton specialised this call itself
    assert len(launched) == 1 and launched[0][-4] is args[0]


def test_free_sizes_run_one_binary_for_every_size_cold_and_warm(cross, tmp_path: Path) -> None:
    """A size argument declared unspecialised is ``free``: after the first launch every other size
    (1, 16, 17, above 2**31) takes the fast path with the same binary; the record describes the size
    by its declared type only, so a warm start's first launch with another size binds the binary."""
    launched, jit_runs = cross
    try:
        module = _import_kernels(tmp_path / "src-cold", FREE_KERNELS)
        launch = KilnLaunch(module.scale_add, {"XBLOCK": 128}, 4, (0,), free=(2,))
        assert launch.free == {2: "i64"} and launch.check == (0,)  # triton agrees it never specialises
        x, y = torch.zeros(300), torch.zeros(300)
        for n in (300, 17, 1, 16, 2**31 + 5):
            launch((3, 1, 1), CTX, x, y, n)
            assert launched[-1][-2:] == (n, 128)
        assert jit_runs == ["scale_add"] and len(launched) == 5  # one trip through triton, for the first
        (binary,) = module.scale_add.device_caches[0][0].values()
        files = collect_triton_binaries((FREE_MODULE,))
        (name,) = [n for n in files if n.startswith(tp.RECORDS_PREFIX)]
        (rec,) = json.loads(files[name])["kernels"]
        assert rec["launch"][-1] == [["T", "torch.float32", True], ["T", "torch.float32", True], ["n", "i64"]]

        sys.modules.pop(FREE_MODULE)
        launched.clear()
        install_triton_binaries(files, "test entry", cache_dir=tmp_path / "fresh")
        module = _import_kernels(tmp_path / "src-warm", FREE_KERNELS)
        jit_runs.clear()
        launch = KilnLaunch(module.scale_add, {"XBLOCK": 128}, 4, (0,), free=(2,))
        launch((1, 1, 1), CTX, x, y, 97)  # not the size the cold process launched first
        assert jit_runs == [] and launched[0][4] == f"function:{binary.hash}"
    finally:
        sys.modules.pop(FREE_MODULE, None)


def test_aligned_call_context_skips_the_per_launch_check_and_a_misaligned_input_does_not(cross, tmp_path: Path
                                                                                        ) -> None:
    """The wrapper tells its launches whether all its graph inputs are 16-byte aligned this call (ctx[2]);
    a launcher adopted with only aligned input tensors checked then skips its own per-launch check. A
    misaligned input (ctx[2] False) is checked again and goes back through triton's path."""
    from kiln.inductor.codegen.triton import launcher as L

    launched, jit_runs = cross
    module = _import_kernels(tmp_path / "src", FREE_KERNELS)
    try:
        launch = KilnLaunch(module.scale_add, {"XBLOCK": 128}, 4, (0,), free=(2,))
        x, y = torch.zeros(301), torch.zeros(300)
        launch((3, 1, 1), CTX, x[:300], y, 300)  # adopted: the checked input is an aligned tensor
        assert launch.run is not None and launch.aligned
        keyed = []

        class Spy(tuple):  # counts the per-launch alignment keys (they iterate the checked positions)
            def __iter__(self):
                keyed.append(1)
                return super().__iter__()
        launch.check = Spy(launch.check)
        launch((3, 1, 1), (0, 7, True), x[:300], y, 300)
        assert keyed == [] and len(launched) == 2 and jit_runs == ["scale_add"]  # fast path, no key
        launch((3, 1, 1), (0, 7, False), x[1:], y, 300)  # misaligned: keyed, then triton's path
        assert keyed and jit_runs == ["scale_add", "scale_add"] and launched[-1][-4].data_ptr() == x[1:].data_ptr()
        assert L.launch_context(x[1:]) == (-1, 0, False)  # the interpreter / no CUDA: the slow-path marker
    finally:
        sys.modules.pop(FREE_MODULE, None)


def test_free_sizes_triton_specialises_after_all_are_checked_per_launch(cross, tmp_path: Path) -> None:
    """``free`` names sizes that the kernel does not declare unspecialised: the launcher believes
    triton (its parameters), keys them per launch, and a size with other specialisation goes back
    through triton's path."""
    launched, jit_runs = cross
    module = _import_kernels(tmp_path / "src", KERNELS)
    launch = KilnLaunch(module.scale_add, {"XBLOCK": 128}, 4, (0,), free=(2,))
    assert launch.free == {} and launch.check == (0, 2)
    x, y = torch.zeros(300), torch.zeros(300)
    launch((3, 1, 1), CTX, x, y, 300)
    launch((3, 1, 1), CTX, x, y, 288)  # a multiple of 16: triton keys another binary
    assert jit_runs == ["scale_add", "scale_add"]
    assert len(module.scale_add.device_caches[0][0]) == 2


WARM_CHILD = '''
import json, sys, torch
from triton.runtime.jit import JITFunction
import kiln.api as kiln
from transformers import GPT2Config, GPT2LMHeadModel
runs = []
original = JITFunction.run
def counted(self, *args, **kwargs):
    runs.append(self.__name__)
    return original(self, *args, **kwargs)
JITFunction.run = counted
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=64, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="sdpa",
                    bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).cuda().eval()
ids = torch.randint(0, 512, (2, 32), device="cuda")
with torch.no_grad():
    eager = model(ids).logits
    out = kiln.compile(model, backend="inductor")(ids).logits
    torch.cuda.synchronize()
torch.testing.assert_close(out, eager, rtol=1e-3, atol=1e-3)
print(json.dumps({"jit_runs": len(runs), "gluon": "triton.experimental.gluon" in sys.modules}))
'''


@pytest.mark.gpu
def test_gpu_warm_first_call_launches_without_jit_run(tmp_path: Path) -> None:
    """A 2-layer GPT-2 compiled in one process and compiled again in a second one with the same
    KILN/TRITON caches: the warm process's first call launches every kernel without triton's
    ``JITFunction.run`` (whose first specialisation imports triton's gluon packages), with eager's results."""
    import subprocess

    pytest.importorskip("transformers")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_CACHE_DIR=str(tmp_path / "kiln"))
    reports = []
    for _run in ("cold", "warm"):
        proc = subprocess.run([sys.executable, "-c", WARM_CHILD], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = reports
    print(reports)
    assert cold["jit_runs"] > 0  # the cold process launched through triton (compiling its kernels)
    assert warm["jit_runs"] == 0, warm  # ("gluon": whether anything else imported triton's gluon)
