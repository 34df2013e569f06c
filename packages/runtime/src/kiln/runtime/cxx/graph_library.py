"""kiln.compile's C++ wrapper libraries: built once into the compile cache, called in-process.

A graph compiled with ``options={"wrapper": "cpp"}`` is a package's model.so (the same build, build.py,
the same C ABI, kiln.inductor's codegen/cpp_wrapper) without weights: every graph input, parameters
included, is passed per call by data pointer. ``build_graph_library`` builds it (cached in the compile
cache by its sources, compiler, torch and host: a second process, or a second graph with the same code,
links nothing); ``GraphLibrary`` loads it from its files (model.so, a CUDA graph's cubins) and is the
compiled graph's ``call_owned``.

Each output follows the graph's output plan (kiln.inductor's ``OutputPlan``, as JSON rows ``[kind,
shape, stride, offset, dtype, input]``): ``direct`` and ``copy`` outputs are allocated here and filled
by the library, an ``input`` output is the caller's input (the library wrote it in place).

Symbolic sizes (``sizes``: each size symbol as ``[name, input, dim]``, dim -1 for an int input, in the
order the library takes them; ``scalars``: the inputs that are ints, passed as no pointer): per call, each symbol's value is read from its input, the plan's sizes
(Python expressions over the symbols, compiled once into one function) give the outputs' layouts, and
the values go to ``kiln_model_run``, which checks the relations the program assumed (a GuardError).
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache import default_cache
from ..cpp import cpp_cache_key
from ..errors import GuardError
from .build import build_model_library
from .loader import ABI_VERSION, DEVICE_TYPES
from .package import KERNELS, LIBRARY, PackageError

NAMESPACE = "cxx_graph"  # built libraries (bytes) by source key
TREES = "cxx_graph_files"  # their folders (model.so + kernels/), by content
SIZE_RELATION_BROKEN = "the input sizes break a relation"  # how the library's check_sizes says it (writer.py)
# a size source's "dim" for a float argument: the library takes its IEEE bits in the int64 slot (a double
# in the C++ wrapper: kiln.inductor's codegen/cpp_wrapper/writer.py size_binding)
FLOAT_ARGUMENT = -2


def _bits(v: float) -> int:
    """A float's IEEE double bits as a signed int64."""
    return int(struct.unpack("<q", struct.pack("<d", float(v)))[0])


def build_graph_library(wrapper_source: str, kernel_source: str, *, kernel_flags: Sequence[str],
                        link_flags: Sequence[str], cxx: str, cubins: Mapping[str, bytes] | None = None,
                        cuda: bool = False) -> dict[str, bytes]:
    """The library's files: ``model.so`` and, for CUDA, ``kernels/<name>`` per cubin (file name -> bytes).

    model.so comes from the compile cache when a process built these sources before."""
    key = cpp_cache_key("\0".join([wrapper_source, kernel_source, torch.__version__, f"cuda={cuda}"]),
                        kernel_flags, cxx, link_flags)

    def build() -> bytes:
        with tempfile.TemporaryDirectory(prefix="kiln-graph-") as tmp:
            out = Path(tmp) / LIBRARY
            build_model_library(wrapper_source, kernel_source, out, kernel_flags=kernel_flags,
                                link_flags=link_flags, cxx=cxx, cuda=cuda)
            return out.read_bytes()
    files = {LIBRARY: default_cache().get_or_build(NAMESPACE, key, build)}
    files.update({f"{KERNELS}/{name}": data for name, data in (cubins or {}).items()})
    return files


def _tree_key(files: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise PackageError(f"C++ wrapper library: unknown dtype {name!r} in its output plan")
    return d


def _extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _python(x: int | str) -> str:
    return str(x) if isinstance(x, int) else f"({x})"


def _layout_function(symbols: Sequence[str], plan: Sequence[Sequence[Any]]) -> Any:
    """``f(*values)``: each output's (shape, stride, offset) at those sizes, from the plan's expressions
    (Python over the symbols, kiln.inductor's printer's: integers, + - * // %, min, max)."""
    rows = []
    for _, shape, stride, offset, _, _ in plan:
        rows.append(f"(({''.join(_python(x) + ', ' for x in shape)}), ({''.join(_python(x) + ', ' for x in stride)}), "
                    f"{_python(offset)})")
    if not all(n.isidentifier() for n in symbols):
        raise PackageError(f"C++ wrapper library: size symbols {list(symbols)} are not names")
    source = f"lambda {', '.join(symbols)}: ({''.join(r + ', ' for r in rows)})"
    return eval(source, {"__builtins__": {}, "min": min, "max": max, "abs": abs})  # noqa: S307 - kiln's printer wrote it


class GraphLibrary:
    """A C++ wrapper library loaded for one device: ``call_owned(args)`` runs the graph on ``args``
    (tensors, in the graph's input order; the list is emptied, as the Python wrapper's is) and returns
    its outputs."""

    def __init__(self, files: Mapping[str, bytes], plan: Sequence[Sequence[Any]], n_inputs: int,
                 device: str | torch.device, sizes: Sequence[Sequence[Any]] = (),
                 scalars: Sequence[int] = ()) -> None:
        self.device = torch.device(device)
        if self.device.type not in DEVICE_TYPES:
            raise PackageError(f"a C++ wrapper library runs on cpu or cuda, not {self.device}")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._where = (DEVICE_TYPES[self.device.type], self.device.index if self.device.index is not None else -1)
        # the folder is written again if another process clears the cache before init has read it
        self.folder, self._lib = default_cache().with_tree(TREES, _tree_key(files), files, self._open)
        self._run = self._lib.kiln_model_run
        self._run.argtypes = [ctypes.c_int] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
        self.n_inputs = n_inputs
        # symbolic sizes: (input, dim) per size symbol, and the outputs' layouts as one function of them
        self._sources = tuple((int(k), int(d)) for _, k, d in sizes)
        self._scalars = frozenset(scalars)  # inputs that are ints (a size, or a value the graph was compiled for)
        self._layouts = _layout_function([str(n) for n, _, _ in sizes], plan) if self._sources else None
        self.plan = [(str(kind), tuple(shape), tuple(stride), offset, _dtype(dtype), int(inp))
                     for kind, shape, stride, offset, dtype, inp in plan]
        # CUDA: an input the library writes in place must be 16-byte aligned (wrap() would copy it and
        # the write would land in the copy): such an input is first copied into aligned memory, which
        # becomes the output (the caller's write-back copies it into the input)
        self._realign = tuple(sorted({p[5] for p in self.plan if p[0] == "input"})) \
            if self.device.type == "cuda" else ()

    def _open(self, folder: Path) -> tuple[Path, ctypes.CDLL]:
        lib = ctypes.CDLL(str(folder / LIBRARY), mode=ctypes.RTLD_LOCAL)
        if lib.kiln_model_abi_version() != ABI_VERSION:
            raise PackageError(f"C++ wrapper library {folder}: ABI {lib.kiln_model_abi_version()}, "
                               f"this loader calls version {ABI_VERSION}")
        init = lib.kiln_model_init
        init.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        err = ctypes.create_string_buffer(2048)
        if init(str(folder).encode(), *self._where, err, len(err)) != 0:
            raise PackageError(f"C++ wrapper library {folder}: {err.value.decode()}")
        return folder, lib

    def _allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], offset: int,
                  dtype: torch.dtype) -> torch.Tensor:
        if offset == 0:
            return torch.empty_strided(shape, stride, dtype=dtype, device=self.device)
        base = torch.empty(offset + _extent(shape, stride), dtype=dtype, device=self.device)
        return base.as_strided(shape, stride, offset)

    def __call__(self, *args: Any) -> tuple:
        return self.call_owned(list(args))

    def call_owned(self, args: list) -> tuple:
        if len(args) != self.n_inputs:
            raise TypeError(f"C++ wrapper library {self.folder.name}: expected {self.n_inputs} inputs, got {len(args)}")
        for k in self._realign:
            a = args[k]
            if a.data_ptr() % 16:
                args[k] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
        sizes = None
        plan: Sequence[tuple] = self.plan
        if self._layouts is not None:
            values = [args[k] if d < 0 else args[k].shape[d] for k, d in self._sources]
            sizes = array.array("q", [_bits(v) if d == FLOAT_ARGUMENT else v for v, (_, d) in zip(values, self._sources)])
            plan = [(p[0], *layout, *p[4:]) for p, layout in zip(self.plan, self._layouts(*values))]
        if self._scalars:  # no pointer for an int: the library takes its value in sizes, or not at all
            ins = array.array("Q", [0 if k in self._scalars else a.data_ptr() for k, a in enumerate(args)])
        else:
            ins = array.array("Q", [a.data_ptr() for a in args])
        result: list[torch.Tensor] = []
        made: list[int] = []
        for kind, shape, stride, offset, dtype, inp in plan:
            if kind == "input":
                result.append(args[inp])
                made.append(0)
                continue
            t = self._allocate(shape, stride, offset, dtype)
            result.append(t)
            made.append(t.data_ptr())
        outs = array.array("Q", made or [0])
        err = ctypes.create_string_buffer(512)  # per call: calls may overlap in threads
        # the library reads the inputs through their pointers: ``held`` keeps them alive until it returns
        # (were args the last reference, the allocator could hand their memory to an allocation in the call)
        held = args.copy()
        args.clear()
        rc = self._run(*self._where, sizes.buffer_info()[0] if sizes is not None else None, ins.buffer_info()[0],
                       None, outs.buffer_info()[0], err, len(err))
        del held
        if rc != 0:
            message = err.value.decode()
            if message.startswith(SIZE_RELATION_BROKEN):
                raise GuardError(f"kiln C++ wrapper ({self.folder.name}): {message}")
            raise RuntimeError(f"kiln C++ wrapper ({self.folder.name}): {message}")
        return tuple(result)
