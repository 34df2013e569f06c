"""kiln.compile's C++ wrapper libraries: built once into the compile cache, called in-process.

A graph compiled with ``options={"wrapper": "cpp"}`` is a package's model.so (the same build, build.py,
the same C ABI, kiln.inductor's codegen/cpp_wrapper) without weights: every graph input, parameters
included, is passed per call by data pointer. ``build_graph_library`` builds it (cached in the compile
cache by its sources, compiler, torch and host: a second process, or a second graph with the same code,
links nothing); ``GraphLibrary`` loads it from its files (model.so, a CUDA graph's cubins) and is the
compiled graph's ``call_owned``.

Each output follows the graph's output plan (kiln.inductor's ``OutputPlan``, as JSON rows ``[kind,
shape, stride, offset, dtype, input]``): an ``input`` output is the caller's input (the library wrote it in
place); every other one the library allocates when its program computes it and hands over
(handover.py), so no output is allocated before the call nor held twice.

Symbolic sizes (``sizes``: each size symbol as ``[name, input, dim]``, dim -1 for an int input, in the
order the library takes them; dim -2 (``FLOAT_ARGUMENT``) for a float input, passed as its IEEE bits;
``scalars``: the inputs that are ints or floats, passed as no pointer): per call, each
symbol's value is read from its input and goes to ``kiln_model_run``, which checks the relations the
program assumed (a GuardError) and lays out the outputs from them.
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

from kiln.graph import guards_native

from ..cache import default_cache
from ..cpp import cpp_cache_key
from .build import build_model_library
from .handover import OutputHandover, run_error
from .loader import ABI_VERSION, DEVICE_TYPES
from .package import KERNELS, LIBRARY, PackageError

NAMESPACE = "cxx_graph"  # built libraries (bytes) by source key
TREES = "cxx_graph_files"  # their folders (model.so + kernels/), by content
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


class GraphLibrary:
    """A C++ wrapper library loaded for one device: ``call_owned(args)`` runs the graph on ``args``
    (tensors, in the graph's input order; the list is emptied, as the Python wrapper's is) and returns
    its outputs. ``held``: inputs the library drops after their last use (a backward's saved activations):
    ``call_owned`` hands it references to them and keeps none itself, so their memory is free for the
    rest of the call when the caller's list held the last references."""

    def __init__(self, files: Mapping[str, bytes], plan: Sequence[Sequence[Any]], n_inputs: int,
                 device: str | torch.device, sizes: Sequence[Sequence[Any]] = (),
                 scalars: Sequence[int] = (), held: Sequence[int] = ()) -> None:
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
        self._sources = tuple((int(k), int(d)) for _, k, d in sizes)  # symbolic sizes: (input, dim) per symbol
        self._scalars = frozenset(scalars)  # inputs that are ints (a size, or a value the graph was compiled for)
        self._skip = bytes(k in self._scalars for k in range(n_inputs)) if self._scalars else None
        self._no_pointers = bytes(8 * n_inputs)
        self.plan = [(str(kind), tuple(shape), tuple(stride), offset, _dtype(dtype), int(inp))
                     for kind, shape, stride, offset, dtype, inp in plan]
        self._outputs = OutputHandover(self._lib, len(self.plan))
        self._returned_inputs = tuple((k, p[5]) for k, p in enumerate(self.plan) if p[0] == "input")
        # CUDA: an input the library writes in place must be 16-byte aligned (wrap() would copy it and
        # the write would land in the copy): such an input is first copied into aligned memory, which
        # becomes the output (the caller's write-back copies it into the input)
        self._realign = tuple(sorted({p[5] for p in self.plan if p[0] == "input"})) \
            if self.device.type == "cuda" else ()
        self._held = tuple(int(k) for k in held)
        self._held_index = array.array("q", self._held)
        if self._held:
            self._hold = self._lib.kiln_model_hold_inputs
            self._hold.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            self._hold.restype = None

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

    def __call__(self, *args: Any) -> tuple:
        return self.call_owned(list(args))

    def call_owned(self, args: list) -> tuple:
        if len(args) != self.n_inputs:
            raise TypeError(f"C++ wrapper library {self.folder.name}: expected {self.n_inputs} inputs, got {len(args)}")
        for k in self._realign:
            a = args[k]
            if a.data_ptr() % 16:
                args[k] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
        sizes = array.array("q", [_bits(args[k]) if d == FLOAT_ARGUMENT else args[k] if d < 0 else args[k].shape[d]
                                  for k, d in self._sources]) if self._sources else None
        ins = array.array("Q", self._no_pointers)
        native = guards_native.current()
        if native is None or native.data_ptrs(args, ins, self._skip) is not True:
            # no pointer for an int: the library takes its value in sizes, or not at all
            ins = array.array("Q", [0 if k in self._scalars else a.data_ptr() for k, a in enumerate(args)])
        slots = self._outputs.slots()
        err = ctypes.create_string_buffer(512)  # per call: calls may overlap in threads
        # the library reads the inputs through their pointers: ``held`` keeps them alive until it returns
        # (were args the last reference, the allocator could hand their memory to an allocation in the call)
        held = args.copy()
        args.clear()
        if self._held:  # the library's references instead of ours: each goes at its input's last use
            impls = array.array("Q", [held[k]._cdata for k in self._held])
            self._hold(self._held_index.buffer_info()[0], impls.buffer_info()[0], len(impls))
            for k in self._held:
                held[k] = None
        rc = self._run(*self._where, sizes.buffer_info()[0] if sizes is not None else None, ins.buffer_info()[0],
                       None, slots.buffer_info()[0], err, len(err))
        if rc != 0:
            raise run_error(err.value.decode(), f"kiln C++ wrapper ({self.folder.name})")
        result = self._outputs.take(slots)
        for k, inp in self._returned_inputs:
            result[k] = held[inp]
        return tuple(result)
