"""C++ spellings of dtypes and constants."""

from __future__ import annotations

import math

import torch

CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.float16: "_Float16", torch.bfloat16: "kiln_bf16",
    torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}


class UnsupportedDtype(Exception):
    pass


def ctype(d: torch.dtype) -> str:
    try:
        return CTYPES[d]
    except KeyError:
        raise UnsupportedDtype(f"dtype {d} is not supported by the C++ backend") from None


def constant(value: bool | int | float, d: torch.dtype) -> str:
    if d == torch.bool:
        return "true" if value else "false"
    if d.is_floating_point:
        t = "float" if d != torch.float64 else "double"
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"{v!r}f" if t == "float" else f"{v!r}"
    if d == torch.int64:
        return f"int64_t({int(value)}LL)" if abs(int(value)) > 2**31 - 1 else f"int64_t({int(value)})"
    return f"{ctype(d)}({int(value)})"


def lowest(d: torch.dtype) -> str:
    if d.is_floating_point:
        return f"-std::numeric_limits<{ctype(d)}>::infinity()"
    if d == torch.bool:
        return "false"
    return f"std::numeric_limits<{ctype(d)}>::lowest()"


def highest(d: torch.dtype) -> str:
    if d.is_floating_point:
        return f"std::numeric_limits<{ctype(d)}>::infinity()"
    if d == torch.bool:
        return "true"
    return f"std::numeric_limits<{ctype(d)}>::max()"
