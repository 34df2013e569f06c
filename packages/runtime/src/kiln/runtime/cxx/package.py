"""The package folder kiln.package writes and both runners read (kiln/runner.h, loader.py).

    model.so               the C++ wrapper + kiln's kernels (C ABI: kiln_model_init / kiln_model_run)
    weights.safetensors    the constants (parameters, buffers, tensor constants), memory-mapped at load
                           (a CUDA package's are copied onto the device once, at load)
    kernels/*.cubin        CUDA packages: the Triton kernels, compiled for the manifest's ``cuda_arch``
    manifest.json          format, schema version, inputs/outputs/constants, size symbols (the input dim
                           each is read from, its range), guards as data, what it was built for, sha256
                           and size of model.so, the weights and each cubin
    src/                   wrapper.cpp and kernels.cpp (CUDA: triton_kernels.py), for reading and rebuilding

The weights file is plain safetensors (8-byte little-endian header length, a JSON header, the data),
written here: tensors ordered by element size so each starts aligned to its own, no holes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..environment import current_host
from ..errors import ArtifactError

FORMAT = "kiln-package"
SCHEMA_VERSION = 2
MANIFEST, LIBRARY, WEIGHTS = "manifest.json", "model.so", "weights.safetensors"
KERNELS = "kernels"  # a CUDA package's cubins
DEVICES = ("cpu", "cuda")

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in SAFETENSORS_DTYPES}


class PackageError(ArtifactError):
    """A package cannot be written or loaded: corrupt, truncated, foreign, or built for something else."""


def dtype_name(d: torch.dtype) -> str:
    name = str(d).removeprefix("torch.")
    if name not in DTYPES:
        raise PackageError(f"dtype {d} cannot be stored in a kiln package")
    return name


def tensor_spec(name: str, shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                device: str = "cpu") -> dict[str, Any]:
    return {"name": name, "dtype": dtype_name(dtype), "shape": [int(x) for x in shape],
            "stride": [int(x) for x in stride], "device": device}


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    order = sorted(tensors, key=lambda n: -tensors[n].element_size())
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    blobs = []
    for name in order:
        t = tensors[name].detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 64)  # the data starts 64-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def file_record(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def built_for(device: str, cxx_flags: Sequence[str], cuda: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the package needs where it runs: this torch (C++ ABI), the device, for ``-march=native``
    kernels this machine's CPU instructions, and for CUDA the GPU architecture its cubins are for
    (``cuda``: ``cuda_arch``, the triton that compiled them, ...)."""
    host = current_host()
    out = {"torch": torch.__version__, "device": device, "machine": host.machine, "cxx_flags": list(cxx_flags)}
    if "-march=native" in cxx_flags:
        out["cpu_flags"] = sorted(host.cpu_flags)
    return {**out, **dict(cuda or {})}


def write_cubins(folder: Path, cubins: Mapping[str, bytes]) -> list[str]:
    """Write a CUDA package's cubins (file name -> binary) under ``kernels/``; their paths in the package.
    Cubins of an older package written to the same folder are removed."""
    d = folder / KERNELS
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("*.cubin"):
        if old.name not in cubins:
            old.unlink()
    for name, data in cubins.items():
        (d / name).write_bytes(data)
    return [f"{KERNELS}/{name}" for name in cubins]


def write_manifest(folder: Path, fields: Mapping[str, Any], extra_files: Sequence[str] = ()) -> dict[str, Any]:
    """manifest.json with the hashes of the library, the weights and ``extra_files`` (cubins) already in
    ``folder``."""
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "library": LIBRARY, "weights": WEIGHTS,
                **fields, "files": {n: file_record(folder / n) for n in (LIBRARY, WEIGHTS, *extra_files)}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(folder: Path, *, verify: bool = True) -> dict[str, Any]:
    """The manifest, checked: format, schema version, torch version, and (``verify``) every file's size
    and sha256. Raises PackageError naming the package and the problem."""
    where = f"kiln package {folder}"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise PackageError(f"{where}: no {MANIFEST} (not a kiln package folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{where}: {MANIFEST} is unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageError(f"{where}: {MANIFEST} is not a kiln package manifest")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise PackageError(f"{where}: manifest schema version {manifest.get('schema_version')}; this kiln reads "
                           f"version {SCHEMA_VERSION} (re-package the model with this kiln)")
    if manifest.get("device") not in DEVICES:
        raise PackageError(f"{where}: built for device {manifest.get('device')!r}; this kiln runs packages on "
                           f"{' or '.join(DEVICES)}")
    built = manifest.get("built_for", {}).get("torch")
    if built != torch.__version__:
        raise PackageError(f"{where}: built for torch {built}, this process runs torch {torch.__version__}")
    missing = sorted(set(manifest.get("built_for", {}).get("cpu_flags", ())) - current_host().cpu_flags)
    if missing:
        raise PackageError(f"{where}: built on a CPU with instructions this one lacks ({', '.join(missing)}); "
                           "rebuild the package on this machine")
    if verify:
        for name, rec in manifest["files"].items():
            p = folder / name
            if not p.exists():
                raise PackageError(f"{where}: {name} is missing")
            got = file_record(p)
            if got["bytes"] != rec["bytes"]:
                raise PackageError(f"{where}: {name} has {got['bytes']} bytes, the manifest says {rec['bytes']} "
                                   "(truncated or replaced)")
            if got["sha256"] != rec["sha256"]:
                raise PackageError(f"{where}: {name} does not match its sha256 in the manifest (corrupt or replaced)")
    return manifest  # type: ignore[no-any-return]
