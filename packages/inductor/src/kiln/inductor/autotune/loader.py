"""Import generated Triton source from a file named by its hash (``triton.jit`` reads source back
through ``inspect``, so kernels must live in real files)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types

from ..knobs import KNOBS


def load_source_module(source: str, prefix: str = "kiln_autotune_") -> types.ModuleType:
    name = prefix + hashlib.sha256(source.encode()).hexdigest()[:32]
    if name in sys.modules:
        return sys.modules[name]
    folder = KNOBS.cache_dir / "autotune_src"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    try:
        current = path.read_text()
    except OSError:
        current = None
    if current != source:  # atomic: another process may be importing the same file
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
