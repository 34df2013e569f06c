"""The runtime's two pipelines, in order. Each step is one function in the module named.

Saving (artifact.build_artifact, then Artifact.save):
  1. normalize sources        sources.normalize           canonical text for every input/guard source
  2. call convention          sources.CallFrame / params  how arguments bind to L (frame or L roots)
  3. guards from specs        artifact.guards_with_specs TENSOR_MATCH for tensor inputs lacking one
  4. bind sources             bindings.bind_sources       argument | external | constant | global
  5. drop frozen guards       artifact.build_artifact     guards on state the artifact now freezes
  6. manifest + seal          manifest.Manifest.sealed    file hashes, versions, host, device, integrity
  7. write atomically         container.write_container   directory or zip, temp + os.replace

Loading (artifact.load_artifact, then loaded.LoadedFunction):
  1. open                     container.open_container    directory or zip; bad zip -> ArtifactError
  2. schema                   manifest.check_schema       format marker, known schema version
  3. integrity                manifest.verified_manifest  the manifest hash over everything (its bytes)
  4. file checksums           artifact.load_artifact      sha256 + size of every listed file
  5. compatibility            checks.check_compatible     kiln/torch/triton versions, device capability
  6. resolve sources          bindings.Resolver           external_data / f_globals / constants
  7. select binaries          checks.usable_files         drop binaries that do not fit this machine
  8. materialize + exec       loaded.exec_program         FILES, FILES_DIR injected; call(args)
  9. per call                 LoadedFunction.__call__     bind args, check guards, gather, call, unflatten
"""

from __future__ import annotations

SAVE_STEPS = ("normalize sources", "call convention", "guards from specs", "bind sources",
              "drop frozen guards", "manifest + seal", "write atomically")
LOAD_STEPS = ("open", "schema", "integrity", "file checksums", "compatibility", "resolve sources",
              "select binaries", "materialize + exec", "per call")
