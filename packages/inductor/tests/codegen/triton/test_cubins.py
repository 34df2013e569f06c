"""Cubins for a package's C++ wrapper (codegen/triton/cubins.py): what a launch needs, read from triton's
kernel metadata (recorded from triton 3.6 and 3.9 compiling for sm_90), what cannot be launched that way
is refused, and a real compile for sm_90 without a GPU (in a subprocess: this folder runs triton's
interpreter, which compiles nothing)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kiln.inductor.codegen.triton.cubins import (
    CubinLaunch,
    CubinUnsupported,
    cpp_size,
    cubin_launch,
    static_grid,
)
from kiln.inductor.codegen.triton.kernel import TritonKernel

# triton 3.6.0's CompiledKernel.metadata for a 3-pointer pointwise kernel, target sm_90 (fields a launch
# does not read left out)
TRITON_36 = {
    "arch": "sm90", "backend_name": "cuda", "debug": False, "global_scratch_align": 1, "global_scratch_size": 0,
    "hash": "b561d2fbf79556f278f34cb4ba9f966a52163652809e0b2373778193f9575b2f", "launch_cooperative_grid": False,
    "launch_pdl": False, "name": "add", "num_ctas": 1, "num_stages": 1, "num_warps": 4, "profile_scratch_align": 1,
    "profile_scratch_size": 0, "shared": 0, "target": ["cuda", 90, 32], "tensordesc_meta": [], "tmem_size": 0,
    "triton_version": "3.6.0", "warp_size": 32,
}
# triton 3.9.0's, same kernel (adds clc, fpsan_homomorphic_casts, min_shared_mem, sched4reg)
TRITON_39 = {**TRITON_36, "clc": False, "fpsan_homomorphic_casts": False, "min_shared_mem": None,
             "sched4reg": False, "triton_version": "3.9.0",
             "hash": "6c672349d0b7492257588e89d12af93ab5b31bbd2cc83e86369d6245f88c25b1"}


@pytest.mark.parametrize("recorded", [TRITON_36, TRITON_39], ids=["triton3.6", "triton3.9"])
def test_launch_from_recorded_metadata(recorded: dict) -> None:
    launch = cubin_launch(recorded)
    assert launch == CubinLaunch(symbol="add", num_warps=4, shared_bytes=0, scratch_params=2, global_scratch_bytes=0,
                                 global_scratch_align=1, arch=90, triton_version=recorded["triton_version"])
    assert json.loads(json.dumps(launch.as_json()))["scratch_params"] == 2


def test_metadata_as_triton_gives_it() -> None:
    """triton's KernelMetadata is a namedtuple whose target is a GPUTarget object."""
    target = collections.namedtuple("GPUTarget", "backend arch warp_size")("cuda", 90, 32)
    fields = {**TRITON_39, "target": target, "shared": 98304, "num_warps": 8, "name": "k3_mm"}
    meta = collections.namedtuple("KernelMetadata", sorted(fields))(**fields)
    launch = cubin_launch(meta)
    assert (launch.symbol, launch.num_warps, launch.shared_bytes, launch.arch) == ("k3_mm", 8, 98304, 90)


def test_scratch_parameters_follow_the_triton_release() -> None:
    """The kernel's trailing pointers: global and profile scratch (3.5+), global only (3.3-3.4), none."""
    older = {k: v for k, v in TRITON_36.items() if not k.startswith("profile_scratch")}
    oldest = {k: v for k, v in older.items() if not k.startswith("global_scratch")}
    assert cubin_launch(older).scratch_params == 1
    assert cubin_launch(oldest).scratch_params == 0
    assert cubin_launch({**TRITON_36, "global_scratch_size": 256, "global_scratch_align": 128}).global_scratch_bytes == 256


@pytest.mark.parametrize(("change", "message"), [
    ({"num_ctas": 2}, "2 CTAs per cluster"),
    ({"launch_cooperative_grid": True}, "cooperative launch"),
    ({"launch_pdl": True}, "programmatic dependent launch"),
    ({"tensordesc_meta": [{"block": [64, 64]}]}, "tensor descriptor"),
    ({"profile_scratch_size": 64}, "profiler's scratch"),
    ({"target": ["hip", 942, 64]}, "backend 'hip'"),
])
def test_launches_the_wrapper_cannot_make_are_refused(change: dict, message: str) -> None:
    with pytest.raises(CubinUnsupported, match=message):
        cubin_launch({**TRITON_39, **change})


def _kernel(**kw: object) -> TritonKernel:
    base = dict(name="k0", source="", pointer_args=("a", "b"), size_args=(), xnumel="1000", xblock=128, rblock=0,
                num_warps=4, kind="pointwise")
    return TritonKernel(**{**base, **kw})  # type: ignore[arg-type]


def test_static_grid() -> None:
    assert static_grid(_kernel()) == (8, 1, 1)
    assert static_grid(_kernel(kind="pointwise_2d", ynumel="30", yblock=16)) == (8, 2, 1)
    with pytest.raises(CubinUnsupported, match="symbolic sizes"):
        static_grid(_kernel(size_args=("s0",), xnumel="s0"))


def test_sizes_as_cpp() -> None:
    """Grids over size symbols, printed by the Triton backend as Python, as C++ int64 expressions."""
    assert cpp_size("64*s0*s1") == "((int64_t(64) * s0) * s1)"
    assert cpp_size("(s0 // 4) % 3 - 1") == "(((s0 / int64_t(4)) % int64_t(3)) - int64_t(1))"
    assert cpp_size("max(s0, 2)") == "std::max<int64_t>(s0, int64_t(2))"
    with pytest.raises(CubinUnsupported, match="no C\\+\\+ form"):
        cpp_size("s0 / 2")


COMPILE = textwrap.dedent("""
    import json, sys, torch
    from kiln.inductor.codegen.triton.cubins import compile_cubins, kernel_param_count
    from kiln.inductor.codegen.triton.kernel import TritonKernel
    from kiln.inductor.codegen.triton.pdl import with_pdl
    from kiln.inductor.ir import Layout
    src = '''
    @triton.jit
    def {name}(ptr_a, ptr_b, ptr_c, XBLOCK: tl.constexpr):
        x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        m = x < 1000
        tl.store(ptr_c + x, tl.load(ptr_a + x, m) * 2.0 + tl.load(ptr_b + x, m), m)
    '''
    def k(name, args, function=""):
        return TritonKernel(name=name, source=src.format(name=name), pointer_args=args, size_args=(), xnumel="1000",
                            xblock=128, rblock=0, num_warps=4, kind="pointwise", function=function)
    layouts = {b: Layout.contiguous((1000,), torch.float32, "cuda") for b in "abcdef"}
    def symbolic(layouts):  # a size parameter as kiln declares it (i64, unspecialised), launched after the pointers
        s = (src.format(name="k2").replace("XBLOCK: tl.constexpr", 's0: "i64", XBLOCK: tl.constexpr')
             .replace("1000", "s0").replace("@triton.jit", "@triton.jit(do_not_specialize=['s0'])"))
        k2 = TritonKernel(name="k2", source=s, pointer_args=("a", "b", "c"), size_args=("s0",), xnumel="s0",
                          xblock=128, rblock=0, num_warps=4, kind="pointwise")
        (c,), (site,) = compile_cubins([k2], layouts, 90)
        narrow = TritonKernel(name="k3", source=s.replace('s0: "i64"', "s0").replace("k2", "k3"),
                              pointer_args=("a", "b", "c"), size_args=("s0",), xnumel="s0", xblock=128, rblock=0,
                              num_warps=4, kind="pointwise")
        try:  # a size compiled as int32 would read half of the int64 the C++ launcher passes: refused
            compile_cubins([narrow], layouts, 90)
            refused = ""
        except Exception as e:
            refused = str(e)
        return [kernel_param_count(c.binary, c.launch.symbol) - c.launch.scratch_params, list(site.grid),
                list(site.size_args), site.numel, refused]
    # the second launches the first's function with the same specialisation: one cubin, two launches; both
    # wait for the kernel before them (programmatic dependent launch, pdl.py)
    pdl = [with_pdl(k("k0", ("a", "b", "c"))), with_pdl(k("k1", ("d", "e", "f"), "k0"))]
    cubins, sites = compile_cubins(pdl, layouts, 90)
    old_gpu, _ = compile_cubins(pdl[:1], layouts, 80)  # no grid dependency control: compiled without it
    print(json.dumps({"cubins": [[c.function, c.binary[:4].hex(), int.from_bytes(c.binary[18:20], "little"),
                                  int.from_bytes(c.binary[48:52], "little"), c.launch.as_json(),
                                  kernel_param_count(c.binary, c.launch.symbol)]
                                 for c in cubins],
                      "sites": [[s.kernel, s.cubin, list(s.grid), list(s.pointer_args)] for s in sites],
                      # the same kernels for another GPU in the same process (triton's JIT kept sm_90 for them)
                      "again": [c.launch.arch for c in compile_cubins([k("k0", ("a", "b", "c"))], layouts, 80)[0]],
                      "pdl": [c.pdl for c in cubins] + [c.pdl for c in old_gpu],
                      "symbolic": symbolic(layouts)}))
""")


@pytest.mark.slow
def test_compile_for_sm90_without_a_gpu() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (function, magic, machine, flags, launch, params), = out["cubins"]
    assert params == 3 + launch["scratch_params"]  # what the cubin takes: the 3 pointers and triton's scratch
    # the sm is e_flags' low byte up to CUDA 12's ptxas (0x5a0d5a), its second byte from CUDA 13's (0x0a005a04)
    sm = flags & 0xFF if flags & 0xFF >= 20 else (flags >> 8) & 0xFF
    assert (function, magic, machine, sm) == ("k0", "7f454c46", 190, 90)  # an ELF for EM_CUDA, sm_90
    assert launch["symbol"] == "k0" and launch["num_warps"] == 4 and launch["arch"] == 90
    assert out["sites"] == [["k0", 0, ["8", "1", "1"], ["a", "b", "c"]], ["k1", 0, ["8", "1", "1"], ["d", "e", "f"]]]
    assert out["again"] == [80]
    assert out["pdl"] == [True, False]  # the C++ wrapper launches the sm_90 cubin with the attribute
    assert out["symbolic"][:4] == [4, ["(s0 + 127) / 128", "1", "1"], ["s0"], "(s0) * (int64_t(1))"]
    assert "size parameters of [4] bytes" in out["symbolic"][4]


def test_interpreter_compiles_no_cubins() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("checks the refusal under TRITON_INTERPRET=1 (this folder's default without a GPU)")
    from kiln.inductor.codegen.triton.cubins import compile_cubins

    with pytest.raises(CubinUnsupported, match="TRITON_INTERPRET=1"):
        compile_cubins([_kernel()], {}, 90)


def test_param_count_refuses_what_is_not_a_cubin() -> None:
    from kiln.inductor.codegen.triton.cubins import kernel_param_count

    with pytest.raises(CubinUnsupported, match="not a 64-bit CUDA ELF"):
        kernel_param_count(b"\x7fELF" + bytes(60), "k0")
