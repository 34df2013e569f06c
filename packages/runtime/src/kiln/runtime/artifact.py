"""Artifacts: build one from a PortableProgram, save it (directory or zip), load and inspect it.

An artifact is a manifest (manifest.py) plus ``program.py`` (the PortableProgram's source, which
defines ``call(args) -> tuple``), ``constants.safetensors`` (tensors the program's inputs read from
closures and globals) and the program's own files (kernel binaries and sources). Nothing is pickled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch
import torch.utils._pytree as pytree

from kiln.graph import Guard, GuardSet, PortableProgram, TensorSpec

from .bindings import bind_sources
from .checks import check_compatible
from .container import check_file_name, open_container, write_container, zip_bytes
from .environment import DeviceInfo, current_host, device_of, environment_record
from .errors import ArtifactError
from .manifest import (
    CONSTANTS_NAME,
    MANIFEST_NAME,
    PROGRAM_NAME,
    FileRecord,
    InputRecord,
    Manifest,
    file_kind,
    manifest_file_bytes,
    sha256,
    spec_expectation,
    verified_manifest,
)
from .sources import CallFrame, Param, display_name, normalize, root_of
from .tensors import tensors_from_bytes, tensors_to_bytes

PathOrFile = str | os.PathLike | BinaryIO


@dataclass(frozen=True)
class Artifact:
    """A saved compiled function: manifest, program source, files and constants. ``as_text()``."""

    manifest: Manifest
    source: str
    files: Mapping[str, bytes]  # the program's files (FILES), without program.py and constants
    constants: Mapping[str, object]
    location: str | None = None
    constants_bytes: bytes | None = None  # as read from disk: a re-save writes exactly these bytes

    @property
    def program(self) -> PortableProgram:
        return PortableProgram(self.source, dict(self.files), self.manifest.requires)

    @property
    def guards(self) -> GuardSet:
        return self.manifest.guards

    def all_files(self) -> dict[str, bytes]:
        out = {PROGRAM_NAME: self.source.encode()}
        if self.constants_bytes is not None:
            out[CONSTANTS_NAME] = self.constants_bytes
        elif self.constants:
            tensors = {k: v for k, v in self.constants.items() if isinstance(v, torch.Tensor)}
            scalars = {k: v for k, v in self.constants.items() if not isinstance(v, torch.Tensor)}
            out[CONSTANTS_NAME] = tensors_to_bytes(tensors, scalars)
        out.update(self.files)
        return out

    def manifest_bytes(self) -> bytes:
        return manifest_file_bytes(self.manifest.to_json())

    def save(self, path: PathOrFile, *, format: str = "auto") -> None:
        """Write to ``path``: a directory (existing dir or trailing '/'), else one zip file."""
        write_container(path, self.manifest_bytes(), self.all_files(), format)

    def to_bytes(self) -> bytes:
        return zip_bytes(self.manifest_bytes(), self.all_files())

    def as_text(self) -> str:
        m = self.manifest
        env = m.environment
        kiln = ", ".join(f"{k} {v}" for k, v in (env.get("kiln") or {}).items())
        lines = [f"# kiln artifact (schema {m.schema_version}) {self.location or ''}".rstrip(),
                 f"backend: {m.backend}   device: {m.device.as_text()}   created: {m.created}",
                 f"built with: torch {env.get('torch')}, triton {env.get('triton')}, "
                 f"python {env.get('python')}, {kiln}",
                 f"call: ({', '.join(p.name for p in m.params)})"
                 + (" -> a pytree of outputs" if m.output_spec else " -> a tuple of outputs"),
                 "inputs:"]
        for i in m.inputs:
            spec = i.spec.as_text() if isinstance(i.spec, TensorSpec) else repr(i.spec)
            lines.append(f"  {i.name:<20} {i.source:<30} {spec}")
        if m.bindings:
            lines.append("bindings:")
            lines += [f"  {b.prefix:<30} {b.kind} {b.key}" for b in m.bindings]
        lines.append(f"guards ({len(m.guards)}, {m.dropped_guards} dropped as frozen):")
        lines += ["  " + line for line in m.guards.as_text().splitlines()]
        lines.append("files:")
        lines += [f"  {f.name:<30} {f.kind:<14} {f.size:>9} B  {f.sha256[:12]}"
                  for f in m.files.values()]
        lines.append(f"integrity: {m.integrity}")
        lines.append(f"# ---- {PROGRAM_NAME} ----")
        lines.append(self.source.rstrip())
        return "\n".join(lines)


def build_artifact(program: PortableProgram, *, input_sources: Sequence[str] | None = None,
                   input_specs: Sequence[TensorSpec | int | None] = (),
                   input_names: Sequence[str] | None = None,
                   guards: GuardSet | Iterable[Guard] = (), frame: CallFrame | None = None,
                   external_data: Mapping[str, object] | None = None,
                   output_spec: pytree.TreeSpec | None = None, backend: str = "unknown",
                   metadata: Mapping[str, Any] | None = None,
                   device: DeviceInfo | None = None) -> Artifact:
    """An in-memory Artifact for ``program``; see ``save_artifact`` for the arguments."""
    sources = _input_sources(input_sources, input_names, input_specs)
    names = _unique_names(input_names or [display_name(s) for s in sources])
    specs = tuple(input_specs) or (None,) * len(sources)
    if not (len(sources) == len(names) == len(specs)):
        raise ArtifactError(f"{len(sources)} input sources, {len(names)} names and {len(specs)} specs "
                            "given; there must be one of each per graph input")
    guard_set = guards_with_specs(GuardSet(tuple(guards)).portable().simplified(), sources, specs)
    params = frame.params if frame is not None else _params_from_sources(
        [*sources, *(g.source for g in guard_set)])
    bound = bind_sources(sources, [g.source for g in guard_set], [p.name for p in params], frame,
                         external_data or {})
    kept = tuple(_portable_note(g) for g in guard_set
                 if g.source in bound.kept_guard_sources or not g.source)
    _check_guards_are_data(kept)
    for name in program.files:
        check_file_name(name)
        if name in (PROGRAM_NAME, CONSTANTS_NAME):
            raise ArtifactError(f"program file name {name!r} is reserved by the artifact format")
    manifest = Manifest(
        backend=backend, environment=environment_record(), host=current_host(),
        device=device or device_of(str(s.device) for s in specs if isinstance(s, TensorSpec)),
        params=params, inputs=tuple(InputRecord(n, s, sp) for n, s, sp in zip(names, sources, specs)),
        bindings=bound.bindings, guards=GuardSet(kept), files={},
        output_spec=pytree.treespec_dumps(output_spec) if output_spec is not None else None,
        requires=tuple(program.requires), dropped_guards=len(guard_set) - len(kept),
        metadata=_json_metadata(metadata))
    art = Artifact(manifest, program.source, dict(program.files), bound.constants)
    records = {n: FileRecord(n, sha256(d), len(d), file_kind(n)) for n, d in art.all_files().items()}
    sealed = Manifest(**{**_fields(manifest), "files": records}).sealed()
    return Artifact(sealed, program.source, dict(program.files), bound.constants)


def _portable_note(g: Guard) -> Guard:
    """The guard with its note's site relative to the package root (``torch/nn/modules/conv.py:561``):
    this machine's absolute paths mean nothing where the artifact loads, and with 1,400 guards they
    were an eighth of a mobilenet's manifest (parsed and hashed on every load)."""
    i = g.note.rfind("site-packages/")
    if i < 0:
        return g
    return Guard(g.source, g.kind, g.expected, g.note[i + len("site-packages/"):])


def _json_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(dict(metadata or {})))
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"artifact metadata must be JSON data: {e}") from e


def _check_guards_are_data(guards: Sequence[Guard]) -> None:
    for g in guards:
        try:
            json.dumps(GuardSet((g,)).to_json())
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"guard {g.as_text()} cannot be saved: its expected value, a "
                                f"{type(g.expected).__name__}, is not data ({e})") from e


def _fields(m: Manifest) -> dict[str, Any]:
    return {f: getattr(m, f) for f in m.__dataclass_fields__}


def save_artifact(path: PathOrFile, program: PortableProgram, *,
                  input_sources: Sequence[str] | None = None,
                  input_specs: Sequence[TensorSpec | int | None] = (),
                  input_names: Sequence[str] | None = None,
                  guards: GuardSet | Iterable[Guard] = (), frame: CallFrame | None = None,
                  external_data: Mapping[str, object] | None = None,
                  output_spec: pytree.TreeSpec | None = None, backend: str = "unknown",
                  metadata: Mapping[str, Any] | None = None, device: DeviceInfo | None = None,
                  format: str = "auto") -> Artifact:
    """Save ``program`` as an artifact at ``path`` and return it.

    Arguments (all optional except what the program needs):
      input_sources: one source per ``call(args)`` input, e.g. ``"L['self'].fc.weight"``
          (default: ``L['<name>']`` per input name, i.e. the inputs are the call's arguments);
      input_specs: a TensorSpec (or int / None) per input; they also give each tensor input a
          TENSOR_MATCH guard unless ``guards`` already has one for that source;
      input_names: readable names for errors (default: from the sources, ``self.fc.weight``);
      guards: a GuardSet (ID_MATCH guards are dropped as non-portable);
      frame: ``CallFrame.of(fn, args, kwargs)`` — the call convention and live values, needed when
          sources reach beyond the arguments (closures, globals);
      external_data: key -> object kept out of the artifact (modules); loads pass the same keys;
      output_spec: a pytree TreeSpec the flat outputs are unflattened into (default: the tuple);
      backend, metadata (JSON-able), device (a DeviceInfo, for cross-compilation);
      format: "auto" (a directory if ``path`` is one or ends with '/', else a zip), "dir", "zip".
    """
    art = build_artifact(program, input_sources=input_sources, input_specs=input_specs,
                         input_names=input_names, guards=guards, frame=frame,
                         external_data=external_data, output_spec=output_spec, backend=backend,
                         metadata=metadata, device=device)
    art.save(path, format=format)
    location = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    return Artifact(art.manifest, art.source, art.files, art.constants, location)


def load_artifact(path: PathOrFile | bytes, *, check_compatibility: bool = True) -> Artifact:
    """Read and verify an artifact (schema, integrity, every file's checksum, compatibility)."""
    container = open_container(path)
    where = container.location
    data = container.read(MANIFEST_NAME)
    try:
        raw = verified_manifest(data)  # schema and integrity
    except ValueError as e:
        raise ArtifactError(f"artifact {where}: manifest.json is not valid JSON ({e})") from e
    manifest = Manifest.from_json(raw)
    files: dict[str, bytes] = {}
    for name, rec in manifest.files.items():
        if name not in (PROGRAM_NAME, CONSTANTS_NAME):
            check_file_name(name)
        data = container.read(name)
        if len(data) != rec.size or sha256(data) != rec.sha256:
            raise ArtifactError(f"artifact {where}: checksum mismatch for file {name!r} (expected "
                                f"{rec.size} bytes with sha256 {rec.sha256[:16]}…, got {len(data)} "
                                f"bytes with sha256 {sha256(data)[:16]}…); the artifact is corrupt")
        files[name] = data
    if PROGRAM_NAME not in files:
        raise ArtifactError(f"artifact {where} lists no {PROGRAM_NAME}")
    if check_compatibility:
        check_compatible(manifest, where)
    try:
        source = files.pop(PROGRAM_NAME).decode()
    except UnicodeDecodeError as e:
        raise ArtifactError(f"artifact {where}: {PROGRAM_NAME} is not UTF-8 text") from e
    blob = files.pop(CONSTANTS_NAME, None)
    constants = tensors_from_bytes(blob) if blob is not None else {}
    return Artifact(manifest, source, files, constants, where, blob)


# ---- helpers ---------------------------------------------------------------------------------------

def _input_sources(sources: Sequence[str] | None, names: Sequence[str] | None,
                   specs: Sequence[object]) -> tuple[str, ...]:
    if sources is not None:
        return tuple(normalize(s) for s in sources)
    if names is not None:
        return tuple(normalize(f"L[{n!r}]") for n in names)
    return tuple(f"L['arg{i}']" for i in range(len(specs)))


def _unique_names(names: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return tuple(out)


def _params_from_sources(sources: Sequence[str]) -> tuple[Param, ...]:
    """Without a frame, the parameters are the distinct ``L`` roots of inputs, then of guards."""
    names: list[str] = []
    for s in sources:
        root = root_of(s)
        if root is not None and root[0] == "L" and root[1] not in names:
            names.append(root[1])
    return tuple(Param(n) for n in names)


def guards_with_specs(guards: GuardSet, sources: Sequence[str],
                       specs: Sequence[TensorSpec | int | None]) -> GuardSet:
    """Normalize guard sources and add a TENSOR_MATCH per tensor input that has none."""
    out = [Guard(normalize(g.source), g.kind, g.expected, g.note) for g in guards]
    matched = {g.source for g in out if g.kind == "TENSOR_MATCH"}
    for source, spec in zip(sources, specs):
        if isinstance(spec, TensorSpec) and source not in matched:
            out.append(Guard(source, "TENSOR_MATCH", spec_expectation(spec), "from the input's spec"))
            matched.add(source)
    return GuardSet(tuple(out))
