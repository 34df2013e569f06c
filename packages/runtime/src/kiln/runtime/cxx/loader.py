"""``load_package(path)``: a kiln package as a Python callable, over the same model.so a C++ program
loads (ctypes, through its C ABI) and the same memory-mapped weights. Nothing is generated or compiled.

A CUDA package runs on the current CUDA device (or the one asked for): its weights are copied there once,
its cubins loaded there by model.so (which refuses a GPU of another architecture), and each call runs on
that device's current stream, as a torch operator would.

Dynamic shapes: each size symbol is read from the input dim the manifest's ``sizes`` name and checked
against its range, every input dim named by a symbol against its value, and model.so checks the other
relations (as kiln/runner.h does).

Outputs: model.so allocates each when its program computes it and hands it over (handover.py).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import GuardError
from .handover import OutputHandover, run_error
from .package import DTYPES, PackageError, read_manifest

ABI_VERSION = 4
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType's codes


class _Spec:
    """A tensor's manifest entry; a symbolic dim is its size symbol's name (or expression) as text."""

    __slots__ = ("name", "dtype", "shape", "stride", "dynamic")

    def __init__(self, d: dict[str, Any]) -> None:
        self.name, self.dtype = d["name"], DTYPES[d["dtype"]]
        self.shape, self.stride = tuple(d["shape"]), tuple(d["stride"])
        self.dynamic = any(isinstance(x, str) for x in self.shape)


class _Size:
    __slots__ = ("symbol", "input", "dim", "min", "max")

    def __init__(self, d: dict[str, Any]) -> None:
        self.symbol, self.input, self.dim, self.min, self.max = d["symbol"], d["input"], d["dim"], d["min"], d["max"]


def _map_weights(path: Path) -> tuple[mmap.mmap, torch.Tensor, dict[str, Any], int]:
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if len(mm) < 8:
        raise PackageError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", mm[:8])
    if n > len(mm) - 8:
        raise PackageError(f"{path}: header runs past the end of the file")
    header = json.loads(bytes(mm[8:8 + n]))
    return mm, torch.frombuffer(mm, dtype=torch.uint8), header, 8 + n


def _device(path: Path, built: str, asked: str | torch.device | None) -> torch.device:
    """The device a package of device type ``built`` runs on here (``asked``, or the current one)."""
    dev = torch.device(asked if asked is not None else built)
    if dev.type != built:
        raise PackageError(f"kiln package {path}: built for {built}, asked to run on {dev} (package it again with "
                           f"kiln.package(..., device={dev.type!r}))")
    if built == "cuda":
        if not torch.cuda.is_available():
            raise PackageError(f"kiln package {path}: built for cuda, and this process has no CUDA device "
                               "(torch.cuda.is_available() is False); package it with device='cpu' to run here")
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    return dev


class PackagedModel:
    """A loaded package: ``model(*inputs)`` returns what the exported function returned (same structure)."""

    def __init__(self, path: str | Path, device: str | torch.device | None = None) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        m = self.manifest
        self.device = _device(self.path, m["device"], device)
        self.inputs = [_Spec(d) for d in m["inputs"]]
        self.outputs = [_Spec(d) for d in m["outputs"]]
        self.sizes = [_Size(d) for d in m.get("sizes", ())]
        self._out_tree = pytree.treespec_loads(m["output_tree"]) if m.get("output_tree") else None
        self._mm, self._bytes, header, base = _map_weights(self.path / m["weights"])
        self._held = self._device_constants(m["constants"], header, base)
        ptrs = [t.data_ptr() for t in self._held] if self._held is not None else [
            self._bytes.data_ptr() + base + header[c["name"]]["data_offsets"][0] for c in m["constants"]]
        self._constants = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        self._lib = ctypes.CDLL(str(self.path / m["library"]), mode=ctypes.RTLD_LOCAL)
        if self._lib.kiln_model_abi_version() != ABI_VERSION:
            raise PackageError(f"kiln package {self.path}: model ABI {self._lib.kiln_model_abi_version()}, "
                               f"this loader calls version {ABI_VERSION}")
        self._err = ctypes.create_string_buffer(2048)
        self._where = (DEVICE_TYPES[self.device.type], self.device.index if self.device.index is not None else -1)
        self._run = self._lib.kiln_model_run
        self._run.argtypes = [ctypes.c_int] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
        self._outputs = OutputHandover(self._lib, len(self.outputs))
        init = self._lib.kiln_model_init
        init.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        if init(str(self.path).encode(), *self._where, self._err, len(self._err)) != 0:
            raise PackageError(f"kiln package {self.path}: {self._err.value.decode()}")

    def _device_constants(self, specs: list[dict[str, Any]], header: dict[str, Any],
                          base: int) -> list[torch.Tensor] | None:
        """CUDA: each constant copied from the mapped weights onto the device (None on CPU: used in place)."""
        if self.device.type == "cpu":
            return None
        out = []
        for c in specs:
            s = _Spec(c)
            lo, hi = header[s.name]["data_offsets"]
            host = self._bytes[base + lo:base + hi].view(s.dtype).as_strided(s.shape, s.stride)
            out.append(torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=self.device).copy_(host))
        return out

    def _checked(self, k: int, t: Any) -> torch.Tensor:
        s = self.inputs[k]
        who = f"kiln package {self.path.name}: input {k} ({s.name!r})"
        if not isinstance(t, torch.Tensor):
            raise GuardError(f"{who} must be a tensor, got {type(t).__name__}", input_name=s.name)
        if t.device != self.device:
            raise GuardError(f"{who} is on {t.device}, the package runs on {self.device}", input_name=s.name,
                             expected=str(self.device), actual=str(t.device))
        if t.dtype != s.dtype:
            raise GuardError(f"{who}: expected dtype {s.dtype}, got {t.dtype}", input_name=s.name,
                             expected=s.dtype, actual=t.dtype)
        if s.dynamic:  # its static dims here, its symbolic ones in _sizes
            if t.dim() != len(s.shape) or any(isinstance(n, int) and t.shape[d] != n for d, n in enumerate(s.shape)):
                raise GuardError(f"{who}: expected shape [{', '.join(map(str, s.shape))}], got {list(t.shape)} (the "
                                 "dims named by a size symbol vary)", input_name=s.name, expected=s.shape,
                                 actual=tuple(t.shape))
            return t.detach().contiguous()
        if tuple(t.shape) != s.shape:
            raise GuardError(f"{who}: expected shape {list(s.shape)}, got {list(t.shape)} (the package was "
                             "exported for static shapes)", input_name=s.name, expected=s.shape, actual=tuple(t.shape))
        if t.stride() != s.stride and t.numel():
            t = torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=self.device).copy_(t)
        return t.detach()

    def _check_fixed(self, given: list[Any]) -> None:
        fixed = _fixed_arguments(self.manifest)
        if len(given) != len(fixed) or any(repr(v) != want for v, (_, want) in zip(given, fixed)):
            said = ", ".join(f"{n}={v}" for n, v in fixed) or "none"
            raise GuardError(f"kiln package {self.path.name}: non-tensor arguments {given!r} differ from the values "
                             f"fixed at export ({said}); export again for other values", expected=fixed, actual=given)

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The flat outputs for the flat inputs (as kiln::Runner::run)."""
        if len(inputs) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise GuardError(f"kiln package {self.path.name}: expected {len(self.inputs)} inputs ({names}), "
                             f"got {len(inputs)}")
        ins = [self._checked(k, t) for k, t in enumerate(inputs)]
        sizes = (ctypes.c_int64 * max(len(self.sizes), 1))(*self._sizes(ins))
        err = ctypes.create_string_buffer(1024)  # per call: runs may overlap in threads
        in_ptrs = (ctypes.c_void_p * max(len(ins), 1))(*[t.data_ptr() for t in ins])
        slots = self._outputs.slots()
        if self._run(*self._where, sizes, in_ptrs, self._constants, slots.buffer_info()[0], err, len(err)) != 0:
            raise run_error(err.value.decode(), f"kiln package {self.path.name}")
        outs = self._outputs.take(slots)
        missing = [k for k, t in enumerate(outs) if t is None]
        if missing:
            raise PackageError(f"kiln package {self.path.name}: model.so handed over no tensor for outputs {missing}")
        return outs  # type: ignore[return-value]

    def _sizes(self, ins: list[torch.Tensor]) -> list[int]:
        """Each size symbol's value, read from its input dim and checked against its range; then the input
        dims named by one symbol checked to be equal (inputs that share a dim; the first one names it)."""
        values = []
        for z in self.sizes:
            v = ins[z.input].shape[z.dim]
            if not z.min <= v <= z.max:
                s = self.inputs[z.input]
                raise GuardError(f"kiln package {self.path.name}: input {z.input} ({s.name!r}) dim {z.dim}: size {v} "
                                 f"is outside the range [{z.min}, {z.max}] the package was exported for",
                                 input_name=s.name, expected=(z.min, z.max), actual=v)
            values.append(v)
        first: dict[str, tuple[int, int]] = {}
        for i, s in enumerate(self.inputs):
            for d, n in enumerate(s.shape):
                if not isinstance(n, str):
                    continue
                j, e = first.setdefault(n, (i, d))
                if ins[i].shape[d] != ins[j].shape[e]:
                    raise GuardError(
                        f"kiln package {self.path.name}: input {i} ({s.name!r}) dim {d}: size {ins[i].shape[d]} must "
                        f"equal input {j} ({self.inputs[j].name!r}) dim {e}, size {ins[j].shape[e]} (the program "
                        f"relates these sizes: both are {n})", input_name=s.name, expected=ins[j].shape[e],
                        actual=ins[i].shape[d])
        return values

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The exported call's arguments: its tensors (nested as exported), and optionally its non-tensor
        arguments, which must equal the values fixed at export (the manifest's ``constant_argument`` guards)."""
        leaves = pytree.tree_leaves((args, kwargs))
        flat = [x for x in leaves if isinstance(x, torch.Tensor)]
        given = [x for x in leaves if not isinstance(x, torch.Tensor)]
        if given:
            self._check_fixed(given)
        outs = self.run(flat)
        return pytree.tree_unflatten(outs, self._out_tree) if self._out_tree is not None else tuple(outs)


def _fixed_arguments(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    return [(g["input"], g["value"]) for g in manifest.get("guards", []) if g.get("kind") == "constant_argument"]


def load_package(path: str | Path, device: str | torch.device | None = None) -> PackagedModel:
    """``device``: where to run (the package's device type; a CUDA package's default is the current device)."""
    return PackagedModel(path, device)
