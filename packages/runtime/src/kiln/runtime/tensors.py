"""Tensors in artifacts as safetensors-format raw bytes: no pickle, readable by the safetensors library.

Layout: an 8-byte little-endian header length, a JSON header mapping each name to its dtype, shape
and byte range, then the raw little-endian data. Devices are restored from ``__metadata__``.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping

import torch

from .errors import ArtifactError

_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def _raw_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().clone().reshape(-1)
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise ArtifactError("saving tensors on a big-endian host is not supported")
    return bytes(flat.view(torch.uint8).clone().untyped_storage()) if flat.numel() else b""


def tensors_to_bytes(tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, object] | None = None
                     ) -> bytes:
    """Tensors (and JSON numbers, kept in the header's metadata) as safetensors bytes."""
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    devices: dict[str, str] = {}
    for name, t in tensors.items():
        if t.dtype not in _CODES:
            raise ArtifactError(f"cannot save constant {name!r}: dtype {t.dtype} is not supported")
        data = _raw_bytes(t)
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        devices[name] = str(t.device)
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"devices": json.dumps(devices), "scalars": json.dumps(dict(scalars or {}))}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data start to 8 bytes
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)


def tensors_from_bytes(data: bytes, *, map_device: bool = True) -> dict[str, object]:
    """Tensors by name, plus the scalars saved with them."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        meta = header.pop("__metadata__", {})
        devices = json.loads(meta.get("devices", "{}"))
        scalars = json.loads(meta.get("scalars", "{}"))
    except (struct.error, ValueError) as e:
        raise ArtifactError(f"constants file is corrupt: bad header ({e})") from e
    base = 8 + n
    out: dict[str, object] = dict(scalars)
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        raw = bytearray(data[base + start:base + end])
        if len(raw) != end - start:
            raise ArtifactError(f"constants file is truncated: tensor {name!r} is incomplete")
        t = (torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw
             else torch.empty(0, dtype=dtype)).reshape(info["shape"])
        device = devices.get(name, "cpu")
        if map_device and device != "cpu":
            t = t.to(device)
        out[name] = t
    return out
