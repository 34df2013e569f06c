"""The artifact manifest: a versioned JSON document describing everything in an artifact.

Every file is listed with its sha256; ``integrity`` is the sha256 of the canonical JSON of the rest
of the manifest, so one hash covers the whole artifact (the files through their listed hashes).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kiln.graph import Guard, GuardSet, TensorSpec

from .bindings import Binding
from .environment import DeviceInfo, HostInfo
from .errors import ArtifactError
from .manifest_sources import compact_sources, read_sources
from .sources import Param

FORMAT = "kiln-artifact"
# 2: a tensor input's TENSOR_MATCH guard that equals the one its spec gives (``spec_guard``) is not
# written (readers rebuild it from ``inputs``): the same check, ~a quarter less manifest to parse
# for a model whose parameters are inputs (a mobilenet's 267). Schema-1 files read as before.
# 3: sources as a read tree (``"sources": [[parent, segment], ...]``, ``source_tree``): inputs and
# guards name a row instead of repeating the source's text (a mobilenet's ~800 sources share a dozen
# prefixes), inputs and guards as rows, notes as a table; a load hands the tree to the guard plan,
# which then reads without splitting sources. The same manifest in ~40 % of the bytes (manifest_sources.py).
SCHEMA_VERSION = 3
MANIFEST_NAME = "manifest.json"
PROGRAM_NAME = "program.py"
CONSTANTS_NAME = "constants.safetensors"

FILE_KINDS = {
    "program": "the generated Python module (defines call(args) -> tuple)",
    "cpp_binary": "a C++ shared library (*.so), used when it fits this CPU",
    "cpp_source": "C++ source (*.cpp, *.c, *.cc) to rebuild a shared library from",
    "python_source": "more generated Python (*.py), e.g. Triton kernels compiled on first call",
    "triton_binary": "compiled Triton kernels (under triton/), used when the GPU and triton match",
    "constants": "tensors saved with the artifact (safetensors format)",
    "data": "any other file the program reads",
}


def file_kind(name: str) -> str:
    if name == PROGRAM_NAME:
        return "program"
    if name == CONSTANTS_NAME:
        return "constants"
    if name.startswith("triton/"):
        return "triton_binary"
    if name.endswith(".so"):
        return "cpp_binary"
    if name.endswith((".cpp", ".c", ".cc")):
        return "cpp_source"
    if name.endswith(".py"):
        return "python_source"
    return "data"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class FileRecord:
    name: str
    sha256: str
    size: int
    kind: str


@dataclass(frozen=True, slots=True)
class InputRecord:
    name: str  # readable, used in guard errors: "x", "self.fc.weight"
    source: str  # the captured graph's source, e.g. "L['self'].fc.weight"
    spec: TensorSpec | int | None


def spec_to_json(spec: TensorSpec | int | None) -> object:
    if spec is None or isinstance(spec, int):
        return spec
    return {"shape": [_dim_json(d) for d in spec.shape], "stride": [_dim_json(d) for d in spec.stride],
            "dtype": str(spec.dtype).removeprefix("torch."), "device": str(spec.device),
            "requires_grad": spec.requires_grad}


def spec_expectation(spec: TensorSpec) -> tuple:
    """The TENSOR_MATCH payload a tensor input's spec gives (dynamic sizes and their strides free)."""
    shape, stride = spec.shape, spec.stride
    if not (_INT.issuperset(map(type, shape)) and _INT.issuperset(map(type, stride))):
        dynamic = spec.is_dynamic
        shape = tuple(d if isinstance(d, int) else None for d in shape)
        stride = tuple(d if isinstance(d, int) and not dynamic else None for d in stride)
    # a load rebuilds hundreds of these (schema 2): the static case stays C-level
    return (str(spec.dtype), str(spec.device), tuple(shape), tuple(stride), spec.requires_grad)


_INT = frozenset({int})


def _spec_guards_left_out(guards: GuardSet, inputs: Sequence[InputRecord]) -> GuardSet:
    """Schema 2's stored guards: without the TENSOR_MATCH guards ``_with_spec_guards`` rebuilds."""
    specs = {i.source: i.spec for i in inputs if isinstance(i.spec, TensorSpec)}
    return GuardSet(tuple(g for g in guards.guards if not (
        g.kind == "TENSOR_MATCH" and g.source in specs and g.expected == spec_expectation(specs[g.source]))))


def _with_spec_guards(guards: GuardSet, inputs: Sequence[InputRecord]) -> GuardSet:
    """A TENSOR_MATCH from its spec for each tensor input with none, after the others (as
    ``guards_with_specs`` adds them: a guard on a type is checked before reads through it)."""
    matched = {g.source for g in guards.guards if g.kind == "TENSOR_MATCH"}
    extra = []
    for i in inputs:
        if isinstance(i.spec, TensorSpec) and i.source not in matched:
            extra.append(Guard(i.source, "TENSOR_MATCH", spec_expectation(i.spec)))
            matched.add(i.source)
    return GuardSet((*guards.guards, *extra)) if extra else guards


def spec_from_json(d: object) -> TensorSpec | int | None:
    if d is None or isinstance(d, int):
        return d
    assert isinstance(d, dict)
    return spec_from_parts(d["dtype"], d["device"], d["shape"], d["stride"], d.get("requires_grad", False))


def spec_from_parts(dtype: str, device: str, shape: list, stride: list, requires_grad: object) -> TensorSpec:
    """A TensorSpec from its JSON parts (a load makes hundreds: the static case stays C-level)."""
    static = _INT.issuperset(map(type, shape)) and _INT.issuperset(map(type, stride))
    dev = _DEVICES.get(device) or _DEVICES.setdefault(device, torch.device(device))
    return TensorSpec(tuple(shape) if static else tuple(_dim_from(x) for x in shape),
                      getattr(torch, dtype), dev,
                      tuple(stride) if static else tuple(_dim_from(x) for x in stride),
                      bool(requires_grad))


_DEVICES: dict[str, torch.device] = {}  # a model's hundreds of inputs share one or two devices


def _dim_json(d: object) -> int | str:
    return d if isinstance(d, int) else str(d)


def _dim_from(d: int | str) -> Any:
    if isinstance(d, int):
        return d
    import sympy  # only for symbolic sizes: a ~0.3 s import static artifacts do not pay

    return sympy.sympify(d)


@dataclass(frozen=True)
class Manifest:
    backend: str
    environment: dict[str, Any]
    host: HostInfo
    device: DeviceInfo
    params: tuple[Param, ...]
    inputs: Sequence[InputRecord]
    bindings: tuple[Binding, ...]
    guards: GuardSet
    files: dict[str, FileRecord]
    output_spec: str | None = None  # torch.utils._pytree.treespec_dumps of the output structure
    requires: tuple[str, ...] = ("torch",)
    dropped_guards: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    integrity: str = ""
    # schema 3: the read tree of the sources (rows ``(source, parent row or -1, segment)``), as read
    source_tree: tuple[tuple[str, int, str], ...] = field(default=(), compare=False, repr=False)
    # schema 3: the guard plan of a load that rewrites no source (``GuardSet.gather_layout``), as read
    guard_layout: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        d = {
            "format": FORMAT, "schema_version": self.schema_version, "created": self.created,
            "backend": self.backend, "environment": self.environment, "host": self.host.to_json(),
            "device": self.device.to_json(),
            "call": {"parameters": [p.to_json() for p in self.params], "output_spec": self.output_spec},
            "inputs": [{"name": i.name, "source": i.source, "spec": spec_to_json(i.spec)}
                       for i in self.inputs],
            "bindings": [b.to_json() for b in self.bindings],
            "guards": (self.guards if self.schema_version < 2
                       else _spec_guards_left_out(self.guards, self.inputs)).to_json(),
            "dropped_guards": self.dropped_guards,
            "program": {"source": PROGRAM_NAME, "requires": list(self.requires)},
            "files": {f.name: {"sha256": f.sha256, "size": f.size, "kind": f.kind}
                      for f in self.files.values()},
            "metadata": self.metadata,
        }
        if self.schema_version >= 3:
            d.update(compact_sources(self.inputs, _spec_guards_left_out(self.guards, self.inputs)))
        d["integrity"] = self.integrity or integrity_of(d)
        return d

    def sealed(self) -> Manifest:
        created = self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        unsealed = replace(self, created=created, integrity="")
        return replace(unsealed, integrity=integrity_of(unsealed.to_json()))

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Manifest:
        check_schema(d)
        try:
            call = d["call"]
            version = int(d["schema_version"])
            tree: tuple[tuple[str, int, str], ...] = ()
            if version >= 3:
                tree, inputs, guards = read_sources(d)
            else:
                inputs = tuple(InputRecord(i["name"], i["source"], spec_from_json(i["spec"]))
                               for i in d["inputs"])
                guards = GuardSet.from_json(d["guards"])
            return Manifest(
                backend=str(d["backend"]), environment=dict(d["environment"]),
                host=HostInfo.from_json(d["host"]), device=DeviceInfo.from_json(d["device"]),
                params=tuple(Param.from_json(p) for p in call["parameters"]),
                inputs=inputs, bindings=tuple(Binding.from_json(b) for b in d["bindings"]),
                guards=_with_spec_guards(guards, inputs) if version == 2 else guards,
                files={n: FileRecord(n, f["sha256"], int(f["size"]), f["kind"])
                       for n, f in d["files"].items()},
                output_spec=call.get("output_spec"), requires=tuple(d["program"]["requires"]),
                dropped_guards=int(d.get("dropped_guards", 0)), metadata=dict(d.get("metadata", {})),
                created=str(d.get("created", "")), schema_version=version,
                integrity=str(d["integrity"]), source_tree=tree,
                guard_layout=d.get("plan") if version >= 3 else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ArtifactError(f"the artifact manifest is malformed: {type(e).__name__}: {e}") from e


def canonical_bytes(d: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the manifest without its ``integrity``: what the integrity hashes."""
    body = {k: v for k, v in d.items() if k != "integrity"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def integrity_of(d: Mapping[str, Any]) -> str:
    return "sha256:" + sha256(canonical_bytes(d))


def manifest_file_bytes(d: Mapping[str, Any]) -> bytes:
    """manifest.json as written: the canonical bytes with ``"integrity"`` appended as the last key.

    Why: a reader verifies the hash over the file's own bytes (``verified_manifest``) instead of
    re-encoding the parsed JSON (3-4 ms for a mobilenet's 1,400 guards, on every load). The hash is
    the same as schema 1 defined it, so readers that re-encode verify these files too.
    """
    body = canonical_bytes(d)
    integrity = d.get("integrity") or "sha256:" + sha256(body)
    if body == b"{}":
        return b'{"integrity":' + json.dumps(integrity).encode() + b"}"
    return body[:-1] + b',"integrity":' + json.dumps(integrity).encode() + b"}"


_TAIL = re.compile(rb',"integrity":"(sha256:[0-9a-f]{64})"\}\s*$')


def verified_manifest(raw: bytes) -> dict[str, Any]:
    """Parse manifest.json and verify its integrity: over its bytes when the file is in canonical
    form (as written since this version), else by re-encoding the parsed body (older files)."""
    d = json.loads(raw)
    check_schema(d)
    tail = _TAIL.search(raw[-120:])
    if tail is not None and isinstance(d, dict) and d.get("integrity") == tail.group(1).decode():
        body = raw[:max(0, len(raw) - 120) + tail.start()]
        if "sha256:" + sha256(body + b"}") == d["integrity"]:
            return d
    verify_integrity(d)  # not canonical bytes (an older or hand-edited file): the slow, same check
    return d


def check_schema(d: Mapping[str, Any]) -> None:
    if not isinstance(d, Mapping) or d.get("format") != FORMAT:
        raise ArtifactError("this is not a kiln artifact: its manifest.json has no "
                            f"\"format\": \"{FORMAT}\"")
    version = d.get("schema_version")
    if not isinstance(version, int):
        raise ArtifactError(f"the artifact manifest has no valid schema_version (got {version!r})")
    if version > SCHEMA_VERSION:
        raise ArtifactError(f"unknown artifact schema version {version}: this kiln-runtime reads "
                            f"schema {SCHEMA_VERSION}; upgrade kiln-runtime to load it")
    if version < 1:
        raise ArtifactError(f"unknown artifact schema version {version}")


def verify_integrity(d: Mapping[str, Any]) -> None:
    want = d.get("integrity")
    got = integrity_of(d)
    if want != got:
        raise ArtifactError(f"the artifact manifest fails its integrity check (recorded {want}, "
                            f"computed {got}): it was modified or corrupted after saving")
