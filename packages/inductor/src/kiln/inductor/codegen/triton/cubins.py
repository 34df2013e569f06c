"""Triton kernels compiled ahead of time into cubins for one GPU architecture (kiln.package, CUDA).

A package's C++ wrapper launches kernels through the CUDA driver API (``cuModuleLoadData``,
``cuLaunchKernel``) with neither triton nor Python in the process, so what triton's launcher knows at
launch time is recorded here from each compiled kernel's metadata (``CubinLaunch``): the kernel's
symbol, the block (``num_warps * 32`` threads), the dynamic shared memory, and the scratch pointers
triton's compiler appends to the kernel's parameters (global scratch, and from triton 3.5 a profiler's
scratch: passed as null when the kernel needs none). What such a launch cannot reproduce (thread-block
clusters, cooperative or programmatic-dependent launches, tensor descriptors, a profiler's scratch)
is refused with ``CubinUnsupported``; kiln's kernels use none of it. Each cubin's own parameter count
(its ``.nv.info`` attributes) is checked against the pointers plus scratch pointers the wrapper will
pass: a triton whose kernel ABI differs fails here, at packaging, not with a kernel reading garbage.

Compiling goes through the same path as the compile pool (``compile_worker.compile_kernel``: the JIT's
``warmup`` with a driver that only names the target), so a package's kernels are the very binaries
``kiln.compile`` would launch on that GPU, and the target needs no GPU here (``cuda_arch`` 90: H100/H200).
The distinct specialisations go to the compile pool first when there is one (on a many-core GPU host);
each is then read back from triton's cache in this process.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...compile_pool import PROCESS_POOL, TritonJob
from ...compile_worker import compile_kernel
from ...ir import Layout, is_float_symbol
from ...knobs import triton_interpret
from .ahead import launch_constants
from .kernel import TritonKernel
from .pdl import with_pdl, without_pdl
from .wrapper import load_triton_module, module_source


class CubinUnsupported(Exception):
    """A kernel that cannot be compiled into a package's cubins, or launched from its C++ wrapper."""


@dataclass(frozen=True, slots=True)
class CubinLaunch:
    """How the C++ wrapper launches one cubin (from triton's kernel metadata)."""

    symbol: str  # the kernel's name inside the cubin (cuModuleGetFunction)
    num_warps: int  # block = num_warps * 32 threads
    shared_bytes: int  # dynamic shared memory per block
    scratch_params: int  # trailing scratch pointers after the kernel's own arguments (0, 1 or 2)
    global_scratch_bytes: int  # per program (0: passed as null)
    global_scratch_align: int
    arch: int  # the sm it was compiled for (90: sm_90)
    triton_version: str

    def as_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "num_warps": self.num_warps, "shared_bytes": self.shared_bytes,
                "scratch_params": self.scratch_params, "global_scratch_bytes": self.global_scratch_bytes,
                "global_scratch_align": self.global_scratch_align, "arch": self.arch,
                "triton_version": self.triton_version}


def _fields(metadata: Any) -> dict[str, Any]:
    if isinstance(metadata, Mapping):
        return dict(metadata)
    if hasattr(metadata, "_asdict"):  # triton's KernelMetadata (a namedtuple)
        return dict(metadata._asdict())
    raise CubinUnsupported(f"triton kernel metadata of type {type(metadata).__name__} is not known here")


def _arch(target: Any) -> tuple[str, int, int]:
    """(backend, arch, warp size) of triton's ``GPUTarget``, or of its recorded list or dict form."""
    if isinstance(target, Mapping):
        return str(target["backend"]), int(target["arch"]), int(target.get("warp_size", 32))
    if isinstance(target, (list, tuple)):
        return str(target[0]), int(target[1]), int(target[2])
    return str(target.backend), int(target.arch), int(target.warp_size)


def cubin_launch(metadata: Any) -> CubinLaunch:
    """Read what a launch needs from triton's metadata of a compiled kernel (``CompiledKernel.metadata``,
    or the same fields as a dict); ``CubinUnsupported`` for what the C++ launch does not reproduce."""
    md = _fields(metadata)
    name = md.get("name", "?")
    backend, arch, warp = _arch(md["target"])
    refusals = [
        (backend != "cuda", f"compiled for backend {backend!r}, not CUDA"),
        (warp != 32, f"warp size {warp}"),
        (int(md.get("num_ctas", 1)) != 1, f"{md.get('num_ctas')} CTAs per cluster"),
        (bool(md.get("launch_cooperative_grid", False)), "a cooperative launch"),
        (bool(md.get("launch_pdl", False)), "a programmatic dependent launch"),
        (bool(md.get("tensordesc_meta")), "tensor descriptor arguments"),
        (int(md.get("profile_scratch_size", 0) or 0) > 0, "a profiler's scratch memory (instrumentation on)"),
    ]
    for bad, what in refusals:
        if bad:
            raise CubinUnsupported(f"triton kernel {name}: {what}; a package's C++ wrapper launches one "
                                   "32-thread-warp CTA per program with the kernel's pointer arguments only")
    scratch = 2 if "profile_scratch_size" in md else 1 if "global_scratch_size" in md else 0
    return CubinLaunch(symbol=str(name), num_warps=int(md["num_warps"]), shared_bytes=int(md.get("shared", 0) or 0),
                       scratch_params=scratch, global_scratch_bytes=int(md.get("global_scratch_size", 0) or 0),
                       global_scratch_align=int(md.get("global_scratch_align", 1) or 1), arch=arch,
                       triton_version=str(md.get("triton_version", "")))


EM_CUDA = 190
_KPARAM_INFO = 0x17  # one EIATTR_KPARAM_INFO attribute per kernel parameter


def _sections(elf: bytes) -> dict[str, bytes]:
    """An ELF64's sections by name."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or struct.unpack_from("<H", elf, 18)[0] != EM_CUDA:
        raise CubinUnsupported("not a 64-bit CUDA ELF (cubin)")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    table = headers[names]

    def name(offset: int) -> str:
        start = table[4] + offset
        return elf[start:elf.index(b"\0", start)].decode()
    return {name(h[0]): elf[h[4]:h[4] + h[5]] for h in headers}


def kernel_param_sizes(cubin: bytes, symbol: str) -> list[int]:
    """The byte size of each parameter ``symbol`` takes, in order, from its ``.nv.info.<symbol>``
    attributes (each 4 bytes: format, attribute, and a 16-bit value or, for sized values, their length
    and then the data; a parameter's data: index u32, ordinal u16, offset u16, flags u32 whose top 14
    bits are its size)."""
    info = _sections(cubin).get(f".nv.info.{symbol}")
    if info is None:
        raise CubinUnsupported(f"the cubin has no .nv.info.{symbol} section")
    i, params = 0, {}
    while i + 4 <= len(info):
        fmt, attr, value = info[i], info[i + 1], struct.unpack_from("<H", info, i + 2)[0]
        if fmt not in (1, 2, 3, 4):
            raise CubinUnsupported(f".nv.info.{symbol}: attribute format {fmt} is not known here")
        if attr == _KPARAM_INFO and fmt == 4 and value >= 12:
            _, ordinal, _, flags = struct.unpack_from("<IHHI", info, i + 4)
            params[ordinal] = flags >> 18
        i += 4 + (value if fmt == 4 else 0)
    return [params[k] for k in sorted(params)]


def kernel_param_count(cubin: bytes, symbol: str) -> int:
    """How many parameters ``symbol`` takes (``kernel_param_sizes``)."""
    return len(kernel_param_sizes(cubin, symbol))


@dataclass(frozen=True)
class Cubin:
    """One compiled kernel specialisation: its binary and how to launch it."""

    function: str  # the Triton function it was compiled from
    binary: bytes
    launch: CubinLaunch
    pdl: bool = False  # launched with programmatic dependent launch (the function waits first: pdl.py)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.binary).hexdigest()

    @property
    def file_name(self) -> str:
        return f"{self.function}.{self.sha256[:12]}.cubin"


@dataclass(frozen=True, slots=True)
class CubinSite:
    """One generated kernel's launch: which cubin, over which grid (C++ int expressions: literals, or
    over the size symbols), with which buffers, then which size symbols (passed as int64: the kernels declare them i64)."""

    kernel: str
    cubin: int  # index into the program's cubins
    grid: tuple[str, str, str]
    pointer_args: tuple[str, ...]
    size_args: tuple[str, ...] = ()
    numel: str = ""  # symbolic sizes: the C++ expression of its element count (no launch when 0)


def static_grid(k: TritonKernel) -> tuple[int, int, int]:
    """The launch grid of a kernel with static sizes (its ``grid`` is then a literal)."""
    if k.size_args:
        raise CubinUnsupported(f"triton kernel {k.name} has symbolic sizes ({', '.join(k.size_args)})")
    grid = ast.literal_eval(k.grid)
    return int(grid[0]), int(grid[1]), int(grid[2])


def _site(k: TritonKernel, cubin: int) -> CubinSite:
    floats = [s for s in k.size_args if is_float_symbol(s)]
    if floats:  # model_support_cuda.h passes size arguments as int64 only
        raise CubinUnsupported(f"triton kernel {k.name} takes float arguments ({', '.join(floats)})")
    if not k.size_args:
        return CubinSite(k.name, cubin, tuple(str(g) for g in static_grid(k)), k.pointer_args)  # type: ignore[arg-type]
    x, y = cpp_size(k.xnumel), cpp_size(k.ynumel)
    gy = f"({y} + {k.yblock - 1}) / {k.yblock}" if k.yblock else "1"
    return CubinSite(k.name, cubin, (f"({x} + {k.xblock - 1}) / {k.xblock}", gy, "1"), k.pointer_args, k.size_args,
                     f"({x}) * ({y})")


_CPP_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}


def cpp_size(expr: str) -> str:
    """A size the Triton backend printed as Python (``python_index``: ints, size symbols, + - * // %,
    max/min) as a C++ int64 expression; sizes are non-negative, so ``//`` and ``%`` are C++'s."""
    def emit(n: ast.AST) -> str:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return f"int64_t({n.value})"
        if isinstance(n, ast.Name):
            return n.id
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return f"(-{emit(n.operand)})"
        if isinstance(n, ast.BinOp) and type(n.op) in _CPP_OPS:
            return f"({emit(n.left)} {_CPP_OPS[type(n.op)]} {emit(n.right)})"
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("max", "min") and n.args:
            out = emit(n.args[0])
            for a in n.args[1:]:
                out = f"std::{n.func.id}<int64_t>({out}, {emit(a)})"
            return out
        raise CubinUnsupported(f"the size {expr!r} has no C++ form here")
    return emit(ast.parse(expr, mode="eval").body)


def _job(k: TritonKernel, layouts: Mapping[str, Layout], path: str, module: str) -> TritonJob:
    missing = [b for b in k.pointer_args if b not in layouts]
    if missing:
        raise CubinUnsupported(f"triton kernel {k.name}: no layout for buffer(s) {missing}")
    dtypes = tuple(str(layouts[b].dtype).removeprefix("torch.") for b in k.pointer_args)
    consts = tuple(sorted(launch_constants(k).items()))
    return TritonJob(path, module, k.function or k.name, dtypes, consts, k.num_warps,
                     int(getattr(k, "num_stages", 1)), builds_launcher=False, sizes=len(k.size_args))


def compile_cubins(kernels: Sequence[TritonKernel], layouts: Mapping[str, Layout],
                   arch: int, pdl: bool | None = None) -> tuple[list[Cubin], list[CubinSite]]:
    """Each distinct specialisation of ``kernels`` compiled for ``sm_<arch>``, and each kernel's launch
    (kernels with an empty iteration space are never launched: no site). ``pdl``: whether the kernels wait
    for the previous one and are launched with programmatic dependent launch (pdl.py) -- for ``arch``, not
    for whatever GPU (or none) the kernels were generated on; None keeps them as generated. Never before
    sm_90."""
    if triton_interpret():
        raise CubinUnsupported("TRITON_INTERPRET=1 is set: triton's interpreter compiles no cubins; package for "
                               "CUDA in a process without it")
    if not kernels:
        return [], []
    if arch < 90 or pdl is False:  # no grid dependency control before sm_90
        kernels = [without_pdl(k) for k in kernels]
    elif pdl:
        kernels = [with_pdl(k) for k in kernels]
    module = load_triton_module(module_source(kernels))
    path, name = str(module.__file__), module.__name__
    target = ("cuda", int(arch), 32)
    jobs: dict[TritonJob, int] = {}
    waits: dict[TritonJob, bool] = {}  # a function's sites all have its prologue, or none does
    sites: list[tuple[TritonKernel, TritonJob]] = []
    for k in kernels:
        if not k.size_args and 0 in static_grid(k):
            continue
        job = _job(k, layouts, path, name)
        jobs.setdefault(job, len(jobs))
        waits[job] = k.pdl
        sites.append((k, job))
    batch = PROCESS_POOL.submit(list(jobs), target, f"a package's {len(jobs)} cubins for sm_{arch}")
    if batch is not None:  # the pool fills triton's cache; each is read back below
        batch.wait()
    cubins = [dataclasses.replace(_cubin(job, target), pdl=waits[job]) for job in jobs]
    return cubins, [_site(k, jobs[job]) for k, job in sites]


def _cubin(job: TritonJob, target: tuple[str, int, int]) -> Cubin:
    try:
        kernel = compile_kernel(job.as_dict(None), target)
    except Exception as e:
        raise CubinUnsupported(f"triton could not compile {job.function} for sm_{target[1]}: "
                               f"{type(e).__name__}: {e}") from e
    binary = kernel.asm.get("cubin") if kernel is not None else None
    if not binary:
        raise CubinUnsupported(f"triton produced no cubin for {job.function} (target sm_{target[1]})")
    launch = cubin_launch(kernel.metadata)
    if launch.arch != target[1]:
        kernel = _compile_for(kernel, job, target)
        binary, launch = kernel.asm.get("cubin"), cubin_launch(kernel.metadata)
        if launch.arch != target[1] or not binary:
            raise CubinUnsupported(f"{job.function}: triton compiled it for sm_{launch.arch}, asked for sm_{target[1]}")
    passed = len(job.dtypes) + job.sizes + launch.scratch_params
    sizes = kernel_param_sizes(bytes(binary), launch.symbol)
    if len(sizes) != passed:
        raise CubinUnsupported(f"{job.function}: its cubin takes {len(sizes)} parameters, the C++ launch would pass "
                               f"{passed} ({len(job.dtypes)} pointers + {job.sizes} sizes + {launch.scratch_params} "
                               f"scratch): this triton ({launch.triton_version}) lays kernel parameters out otherwise")
    widths = sizes[len(job.dtypes):len(job.dtypes) + job.sizes]
    if any(w != 8 for w in widths):  # the C++ launcher passes each size as an int64 (model_support_cuda.cpp)
        raise CubinUnsupported(f"{job.function}: its cubin takes size parameters of {widths} bytes, the C++ "
                               "launch passes 8-byte ints")
    return Cubin(job.function, bytes(binary), launch)


def _compile_for(kernel: Any, job: TritonJob, target: tuple[str, int, int]) -> Any:
    """``kernel``'s source (the JIT's specialisation) compiled again, directly, for ``target``. Why: triton's
    JIT keeps one target per device and function, so a function this process compiled for another GPU
    before (a package for another sm, or kiln.compile on this GPU) comes back for that one from
    ``warmup``; with the same options ``triton.compile`` gives the JIT's very binary (same hash)."""
    import triton
    from triton.backends.compiler import GPUTarget

    try:
        return triton.compile(kernel.src, target=GPUTarget(*target),
                              options={"num_warps": job.num_warps, "num_stages": job.num_stages})
    except Exception as e:
        raise CubinUnsupported(f"triton could not compile {job.function} for sm_{target[1]}: "
                               f"{type(e).__name__}: {e}") from e
