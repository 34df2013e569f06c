"""Will this artifact run here? Version and device checks, and which shipped binaries fit.

Policy (what a mismatch means for generated code):
- kiln-runtime: a compatible release (same major; same minor while 0.x), or the artifact's layout
  and helpers may differ.
- torch: the same major.minor — generated code calls ATen operators whose schemas and behaviour
  change between releases.
- triton: needed when the artifact has Triton kernels; the same major, else the kernel source may not
  compile. Shipped Triton binaries are used only with the same triton release and GPU capability,
  otherwise they are dropped and Triton recompiles from source (logged).
- device: a CUDA artifact needs a CUDA device with at least the capability it was compiled for.
- host CPU: a C++ binary built for a CPU with instructions this one lacks is dropped and rebuilt
  from its source (logged); without a source that is an error.
- Python: recorded only; artifacts hold source, not bytecode, so any supported Python runs them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .environment import (
    RUNTIME_VERSION,
    compatible_release,
    current_capability,
    current_host,
    release,
    torch_version,
    triton_version,
)
from .errors import ArtifactError
from .manifest import Manifest

logger = logging.getLogger("kiln.runtime")

_RECOMPILE = "recompile the function with this environment (or load with check_compatibility=False)"


def uses_triton(m: Manifest) -> bool:
    return "triton" in m.requires or any(f.kind == "triton_binary" for f in m.files.values())


def check_compatible(m: Manifest, where: str) -> None:
    """Raise ArtifactError when the artifact cannot run in this process."""
    env = m.environment
    theirs = (env.get("kiln") or {}).get("kiln-runtime")
    ours = RUNTIME_VERSION
    if theirs and ours and not compatible_release(theirs, ours):
        raise ArtifactError(f"artifact {where} was written by kiln-runtime {theirs}, which is not "
                            f"compatible with kiln-runtime {ours} here; {_RECOMPILE}")
    if release(env.get("torch")) != release(torch_version()):
        raise ArtifactError(f"artifact {where} was compiled with torch {env.get('torch')}, but this "
                            f"is torch {torch_version()}; {_RECOMPILE}")
    if uses_triton(m):
        here = triton_version()
        if here is None:
            raise ArtifactError(f"artifact {where} has Triton kernels but triton is not installed: "
                                "pip install triton")
        rt, rh = release(env.get("triton")), release(here)
        if rt is not None and rh is not None and rt[0] != rh[0]:
            raise ArtifactError(f"artifact {where} was compiled with triton {env.get('triton')}, but "
                                f"this is triton {here}; {_RECOMPILE}")
    _check_device(m, where)


def _check_device(m: Manifest, where: str) -> None:
    if m.device.type != "cuda":
        return
    cap = current_capability()
    if cap is None:
        raise ArtifactError(f"artifact {where} was compiled for {m.device.as_text()}, but this "
                            "machine has no CUDA device (torch.cuda.is_available() is False)")
    want = m.device.capability
    if want is not None and cap < want:
        raise ArtifactError(f"artifact {where} was compiled for {m.device.as_text()}, but this GPU is "
                            f"sm_{cap[0]}{cap[1]}, which is older; recompile on this machine")


def usable_files(m: Manifest, files: Mapping[str, bytes], where: str) -> dict[str, bytes]:
    """The files to hand to the program: binaries that do not fit this machine are left out."""
    out = dict(files)
    missing = m.host.missing_on(current_host())
    names = set(files)
    for name, rec in m.files.items():
        if rec.kind == "cpp_binary" and missing:
            stem = name.removesuffix(".so")
            if not any(f"{stem}{ext}" in names for ext in (".cpp", ".cc", ".c")):
                raise ArtifactError(f"artifact {where}: C++ kernel {name} was built for a CPU with "
                                    f"{', '.join(missing[:8])}, which this machine lacks, and the "
                                    "artifact has no source to rebuild it; recompile here")
            logger.info("artifact %s: C++ kernel %s was built for another CPU (%s); it will be "
                        "rebuilt from source", where, name, ", ".join(missing[:8]))
            out.pop(name, None)
        elif rec.kind == "triton_binary" and not _triton_binaries_fit(m):
            out.pop(name, None)
    return out


def _triton_binaries_fit(m: Manifest) -> bool:
    fits = (m.environment.get("triton") == triton_version()
            and m.device.capability is not None and m.device.capability == current_capability())
    if not fits:
        logger.info("shipped Triton binaries were built for another GPU or triton release; Triton "
                    "recompiles the kernels from source on first call")
    return fits
