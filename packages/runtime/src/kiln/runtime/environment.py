"""What an artifact records about the machine that built it, and what loading compares it with.

Versions (kiln distributions, torch, triton, Python), the host CPU (architecture and ISA flags, so a
``-march=native`` C++ kernel is not run on a CPU that lacks its instructions) and the target device.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

KILN_DISTRIBUTIONS = ("kiln", "kiln-graph", "kiln-capture", "kiln-autograd", "kiln-decomp",
                      "kiln-inductor", "kiln-runtime")


# kiln-runtime's own release, as in packages/runtime/pyproject.toml (a test keeps them equal): the
# load path compares it with the artifact's without an importlib.metadata scan (~5 ms cold)
RUNTIME_VERSION = "0.1.0"


@functools.cache
def kiln_versions() -> dict[str, str]:
    """Versions of the kiln distributions installed here (absent ones are left out)."""
    out: dict[str, str] = {}
    for dist in KILN_DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


@functools.cache
def triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_version() -> str:
    return str(torch.__version__).split("+")[0]


def python_version() -> str:
    return ".".join(str(p) for p in sys.version_info[:3])


def release(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '2.15.0+cu132' or '3.9.0.dev1'."""
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def compatible_release(a: str | None, b: str | None) -> bool:
    """Same major; for 0.x versions (where minor releases break things) the same minor too."""
    ra, rb = release(a), release(b)
    if ra is None or rb is None:
        return False
    if ra[0] != rb[0]:
        return False
    return ra[0] != 0 or ra[1] == rb[1]


@dataclass(frozen=True, slots=True)
class HostInfo:
    """The CPU that built the artifact's C++ kernels."""

    machine: str
    cpu_flags: frozenset[str]

    def to_json(self) -> dict[str, object]:
        return {"machine": self.machine, "cpu_flags": sorted(self.cpu_flags)}

    @staticmethod
    def from_json(d: dict) -> HostInfo:
        return HostInfo(str(d.get("machine", "")), frozenset(d.get("cpu_flags", ())))

    def missing_on(self, other: HostInfo) -> list[str]:
        """Why binaries built on this host may not run on ``other`` (empty: they fit)."""
        if self.machine != other.machine:
            return [f"architecture {self.machine} (this machine is {other.machine})"]
        return sorted(self.cpu_flags - other.cpu_flags)


def _read_cpu_flags(lines: Iterable[str]) -> frozenset[str]:
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def current_host() -> HostInfo:
    try:
        with open("/proc/cpuinfo") as f:
            flags = _read_cpu_flags(f)
    except OSError:
        flags = frozenset()
    return HostInfo(platform.machine(), flags)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The accelerator an artifact targets: 'cpu', or 'cuda' with the capability its kernels assume."""

    type: str
    capability: tuple[int, int] | None = None  # None: cross-compiled, kernels finish compiling on load
    name: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"type": self.type,
                "capability": list(self.capability) if self.capability else None,
                "name": self.name}

    @staticmethod
    def from_json(d: dict) -> DeviceInfo:
        cap = d.get("capability")
        return DeviceInfo(str(d.get("type", "cpu")), (int(cap[0]), int(cap[1])) if cap else None,
                          d.get("name"))

    def as_text(self) -> str:
        if self.type != "cuda":
            return self.type
        cap = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "any capability"
        return f"cuda ({self.name or 'GPU'}, {cap})"


def device_of(device_types: Iterable[str]) -> DeviceInfo:
    """The target device of a program whose inputs live on ``device_types``."""
    types = {str(t).split(":")[0] for t in device_types}
    if "cuda" not in types:
        return DeviceInfo("cpu")
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return DeviceInfo("cuda", tuple(torch.cuda.get_device_capability(index)),  # type: ignore[arg-type]
                          torch.cuda.get_device_name(index))
    return DeviceInfo("cuda")  # compiled on a host without the device: no capability to record


def current_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(torch.cuda.current_device()))  # type: ignore[return-value]


def environment_record() -> dict[str, object]:
    return {"kiln": kiln_versions(), "torch": torch_version(), "triton": triton_version(),
            "python": python_version(), "platform": f"{platform.system()}-{platform.machine()}"}
