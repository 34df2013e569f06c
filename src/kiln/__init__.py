"""kiln: a staged compiler for PyTorch programs.

``kiln.compile(model)`` captures Python bytecode into graphs (kiln.capture), traces forward and
backward ATen graphs (kiln.autograd), decomposes them (kiln.decomp), generates kernels
(kiln.inductor) and stores artifacts (kiln.runtime). See README.md.
"""

import importlib as _importlib
import pkgutil as _pkgutil
import types as _types
from typing import Any as _Any

# kiln is a namespace shared by every stage distribution; this makes kiln.<stage> importable whether
# the stages are installed together (this meta-package) or alone.
__path__ = _pkgutil.extend_path(__path__, __name__)

# Note: the API is loaded on first use (PEP 562), so ``import kiln.runtime`` in a deployment process
# loads the runtime alone, not the compiler stages behind ``kiln.compile``.
_API = {
    "compile": "kiln.api", "explain": "kiln.api", "load_compiled_function": "kiln.runtime",
    "mark_dynamic": "kiln.api", "reset": "kiln.api", "list_backends": "kiln.backends",
    "register_backend": "kiln.backends", "set_logs": "kiln.graph",
    "export": "kiln.deploy", "package": "kiln.deploy", "load_package": "kiln.deploy",
    "stats": "kiln.compile_stats",
    "stats_reset": "kiln.compile_stats", "CompileStats": "kiln.compile_stats",
    "disable": "kiln.capture", "allow_in_graph": "kiln.capture", "is_compiling": "kiln.capture",
    "set_stance": "kiln.capture", "mark_static": "kiln.capture",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> _Any:
    if name in _API:
        value = getattr(_importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API and the stage packages loaded so far (not this module's own helpers)."""
    stages = [n for n, v in globals().items() if isinstance(v, _types.ModuleType) and v.__name__.startswith("kiln.")]
    return sorted({*_API, *stages})
