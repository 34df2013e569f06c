"""The constant code of generated programs, imported instead of compiled with every artifact.

Carried as source in kiln.inductor's wrappers and kiln.autograd's programs, these helpers would be
compiled again by each load of an artifact in a new process (as much as the program's own body for a
small model, on a new machine's load + first call). As a module of kiln-runtime its
bytecode is cached by Python (``.pyc``), so a load only imports it, once per process. Programs that
use it list ``kiln.runtime`` in their ``requires``. The names and behaviour here are part of the
artifact format: programs saved by this version call them, so change them only compatibly.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, NoReturn

import torch
from torch.utils._pytree import treespec_loads

from kiln.graph import CallSignature, ListCall, inference_call, training_call

# ---- kiln.inductor wrappers ---------------------------------------------------------------------


def restride(t: Any, size: tuple[int, ...], stride: tuple[int, ...], dtype: Any = None,
             device: Any = None) -> torch.Tensor:
    """Extern and fallback kernels may return other strides than the trace said (a convolution follows
    its input's layout, cuDNN picks its own); kernels index by the plan, so copy into it if needed.
    An output ATen left undefined (None: attention's logsumexp when not asked for) gets fresh memory
    (the memory plan may reuse the buffer)."""
    if t is None:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)
    if t.stride() == stride or t.numel() <= 1 or all(a == b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _conv_tf32() -> bool:
    """Whether ATen's convolution would let cuDNN use TF32 for fp32 now (the new precision API's
    effective value where torch has it, else the legacy flag)."""
    try:
        return torch.backends.cudnn.conv.fp32_precision == "tf32"  # type: ignore[attr-defined]
    except AttributeError:
        return bool(torch.backends.cudnn.allow_tf32)


def conv_out(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: list, padding: list,
             dilation: list, transposed: bool, output_padding: list, groups: int,
             out: torch.Tensor) -> torch.Tensor:
    """``torch.convolution`` written into ``out`` (a slot of the wrapper's arena) where ATen would run
    cuDNN or its depthwise kernel, the two with an ``out=`` form, with the flags ATen passes; else
    the plain call, its result in fresh memory (re-strided to ``out``'s layout), which is returned."""
    if x.is_cuda and not transposed and x.dim() == 4:
        backend = torch._C._select_conv_backend(x, w, bias, stride, padding, dilation, transposed,
                                                output_padding, groups, None)
        if backend == torch._C._ConvBackend.Cudnn:  # type: ignore[attr-defined]
            deterministic = torch.backends.cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
            torch.ops.aten.cudnn_convolution.out(x, w, padding, stride, dilation, groups, torch.backends.cudnn.benchmark,
                                                 deterministic, _conv_tf32(), out=out)
            if bias is not None:
                out.add_(bias.view(1, -1, 1, 1))
            return out
        if backend == torch._C._ConvBackend.CudaDepthwise2d and out.is_contiguous():  # type: ignore[attr-defined]
            torch.ops.aten._conv_depthwise2d.out(x.contiguous(), w, w.shape[2:], bias, stride, padding, dilation, out=out)
            return out
    return restride(torch.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups),
                    tuple(out.shape), tuple(out.stride()))


def take_arena(nbytes: int, tail: int, device: str) -> torch.Tensor:
    """A wrapper's arena (kiln.inductor scheduler/arena.py). While a CUDA graph records, one block of
    ``nbytes + tail`` is taken and freed first, so the arena is carved from its start and the rest
    of that segment serves what the call allocates beside the arena (a private pool otherwise opens a
    20 MB segment for a 1-10 MB request)."""
    if torch.cuda.is_current_stream_capturing():
        torch.empty((nbytes + tail,), dtype=torch.uint8, device=device)
    return torch.empty((nbytes,), dtype=torch.uint8, device=device)


def _view(v: Sequence[Any] | None) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    return v if v is None else (tuple(v[0]), tuple(v[1]), v[2])


def ext_callers(text: str) -> tuple[list[tuple], Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The extern-call table of a wrapper (JSON rows ``[consts, size, stride, *views]``) and its three
    callers ``ext(fn, i, *args)``, ``ext2(fn, i, a, b)``, ``ext3(fn, i, a, b, c)``: row ``i``'s
    trailing constant arguments are appended, tensor arguments with a view in the row are viewed
    first, and the result is re-strided to the row's size/stride only if it differs. The callers are
    closures over the table (a cell read per call, as fast as the global read of the inline helpers
    they replace)."""
    table: list[tuple[Any, ...]] = [(tuple(r[0]), tuple(r[1]), tuple(r[2]), *map(_view, r[3:]))
                                    for r in json.loads(text)]

    def ext(fn: Any, i: int, *args: Any) -> Any:
        consts, size, stride = table[i]
        t = fn(*args, *consts)
        if t is not None and t.stride() == stride:
            return t
        return restride(t, size, stride)

    def ext2(fn: Any, i: int, a: Any, b: Any) -> Any:
        consts, size, stride, va, vb = table[i]
        if va is not None:
            a = (a.as_strided(va[0], va[1], a.storage_offset() + va[2]) if va[2]
                 else a.as_strided(va[0], va[1]))  # as_strided keeps the storage offset
        if vb is not None:
            b = (b.as_strided(vb[0], vb[1], b.storage_offset() + vb[2]) if vb[2]
                 else b.as_strided(vb[0], vb[1]))  # as_strided keeps the storage offset
        t = fn(a, b, *consts)
        if t is not None and t.stride() == stride:
            return t
        return restride(t, size, stride)

    def ext3(fn: Any, i: int, a: Any, b: Any, c: Any) -> Any:
        consts, size, stride, va, vb, vc = table[i]
        if va is not None:
            a = (a.as_strided(va[0], va[1], a.storage_offset() + va[2]) if va[2]
                 else a.as_strided(va[0], va[1]))  # as_strided keeps the storage offset
        if vb is not None:
            b = (b.as_strided(vb[0], vb[1], b.storage_offset() + vb[2]) if vb[2]
                 else b.as_strided(vb[0], vb[1]))  # as_strided keeps the storage offset
        if vc is not None:
            c = (c.as_strided(vc[0], vc[1], c.storage_offset() + vc[2]) if vc[2]
                 else c.as_strided(vc[0], vc[1]))  # as_strided keeps the storage offset
        t = fn(a, b, c, *consts)
        if t is not None and t.stride() == stride:
            return t
        return restride(t, size, stride)

    return table, ext, ext2, ext3


def load_library(files_dir: str | None, name: str, flags: Sequence[str], link: Sequence[str]) -> ctypes.CDLL:
    """The wrapper's C++ kernel library from ``files_dir``; if it cannot be loaded (another machine
    or libc), rebuilt from the shipped ``.cpp`` with the same flags into a temporary folder."""
    path = os.path.join(files_dir or "", name)
    try:
        return ctypes.CDLL(path)
    except OSError as first:
        import subprocess
        import tempfile
        out = os.path.join(tempfile.mkdtemp(prefix="kiln-rebuild-"), name)
        cmd = [*flags, path[:-3] + ".cpp", "-o", out, *link]
        try:
            subprocess.run(cmd, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"cannot load {path} ({first}) nor rebuild it from its C++ source ({e})") from e
        return ctypes.CDLL(out)


_MEMORY_LIBRARIES: list[int] = []  # their memfds stay open: see _dlopen_memory


def load_library_from(files: Mapping[str, bytes] | None, files_dir: str | None, name: str,
                      flags: Sequence[str], link: Sequence[str]) -> ctypes.CDLL:
    """``load_library``, from the library's bytes in the program's ``FILES`` when it has them: on
    Linux through a memfd, so a new machine's load writes no folder for it (creating the cache's
    folders and files is a visible part of a small model's load). Else from ``files_dir``; with no folder,
    the library and its source are written to a temporary one first (load_library's rebuild reads
    the ``.cpp`` there)."""
    files = files or {}
    data = files.get(name)
    if data is not None and hasattr(os, "memfd_create"):
        lib = _dlopen_memory(name, data)
        if lib is not None:
            return lib
    if not files_dir and files:
        import tempfile
        files_dir = tempfile.mkdtemp(prefix="kiln-lib-")
        for n in (name, name[:-3] + ".cpp"):
            if n in files:
                with open(os.path.join(files_dir, n), "wb") as f:
                    f.write(files[n])
    return load_library(files_dir, name, flags, link)


def _dlopen_memory(name: str, data: bytes) -> ctypes.CDLL | None:
    """dlopen ``data`` from an anonymous in-memory file, or None where that does not work (no memfd,
    a kernel that forbids executable memfds). The memfd stays open for the process: dlopen knows a
    loaded library by its path, so ``/proc/self/fd/N`` must never name another library."""
    try:
        fd = os.memfd_create(os.path.basename(name), getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        return None
    _MEMORY_LIBRARIES.append(fd)
    return lib


def bind_kernels(namespace: MutableMapping[str, Any], lib: ctypes.CDLL, table: str) -> None:
    """Binds each kernel's ctypes function in ``namespace`` (the wrapper's globals): a line of
    ``table`` is the launcher's name, its exported symbol (kernels with one body share it) and its
    number of pointer arguments."""
    for line in table.splitlines():
        if line:
            name, symbol, n_args = line.split()
            fn = getattr(lib, symbol)
            fn.argtypes = [ctypes.c_void_p] * int(n_args)
            fn.restype = None
            namespace[name] = fn


# ---- kiln.autograd programs ---------------------------------------------------------------------


def load_part(namespace: MutableMapping[str, Any], source: str, prefix: str) -> tuple[ListCall, ListCall | None]:
    """Runs one embedded part (a forward or backward wrapper) of a program in its own namespace, with
    the program's files under ``prefix``; returns its ``call(list)``, and its ``call_owned(list)`` when
    it has one (kiln.inductor's wrappers: it takes the list's references over). Compiles with the
    program's ``compile`` (the loader's code cache, where kiln.runtime injected it)."""
    files = namespace.get("FILES") or {}
    part_files = {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}
    root = namespace.get("FILES_DIR")
    part_dir = os.path.join(root, prefix) if root else root
    ns: dict[str, Any] = {"FILES": part_files, "FILES_DIR": part_dir, "__name__": "kiln_part"}
    compile_fn = namespace.get("compile", compile)
    exec(compile_fn(source, "<kiln " + prefix + ">", "exec"), ns)  # noqa: S102 - the program's own part
    owned = ns.get("call_owned")
    if owned is None:
        return ns["call"], None
    return (lambda args: owned(list(args))), owned


def autograd_program(namespace: MutableMapping[str, Any], fw_source: str, bw_source: str,
                     sig: dict[str, Any]) -> Callable[[list[Any]], Any]:
    """The ``call(args)`` of a kiln.autograd program: its forward part, behind kiln.graph's
    compiled-training ``autograd.Function`` (the one kiln.autograd uses in-process) when it has a
    backward part, and the outputs rebuilt by ``sig`` (the graph signature: aliases of inputs and
    outputs, mutated inputs, constants, the output tree)."""
    fw, fw_owned = load_part(namespace, fw_source, "fw/")
    call_sig = CallSignature.from_json(sig, treespec_loads(sig["out_spec"]))
    if not bw_source:
        return inference_call(call_sig, fw_owned or fw)  # it calls with a list of its own
    bw, bw_owned = load_part(namespace, bw_source, "bw/")
    call_training, function = training_call(call_sig, fw_owned or fw, bw, bw_owned)
    call_training.autograd_function = function  # type: ignore[attr-defined]
    return call_training


def load_constant(files: MutableMapping[str, bytes], key: str, size: Sequence[int], stride: Sequence[int],
                  dtype: torch.dtype, device: str) -> torch.Tensor:
    """A graph constant saved as its contiguous bytes (``files[key]``), rebuilt with its strides on ``device``."""
    raw = files[key]
    flat = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if raw
            else torch.empty(0, dtype=dtype))
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device=device)
    if out.numel():
        out.copy_(flat.reshape(tuple(size)))
    return out


# ---- indices out of range in C++ kernels ---------------------------------------------------------


def index_errors(lib: ctypes.CDLL) -> ctypes.Array:
    """A kernel library's record of indices found out of range (count, last index, its dim's size):
    kiln.inductor's C++ prelude (``kiln_check_index``) keeps it; a wrapper compares the count around
    each kernel that checks indices."""
    fn = lib.kiln_index_errors
    fn.restype, fn.argtypes = ctypes.c_void_p, []
    return (ctypes.c_int64 * 3).from_address(fn())


def index_error(state: ctypes.Array, kernel: str) -> NoReturn:
    """Eager's IndexError for an index a kernel found out of range."""
    raise IndexError(f"index {state[1]} is out of bounds for a dimension of size {state[2]} "
                     f"(kiln kernel {kernel}; eager raises IndexError here too)")
