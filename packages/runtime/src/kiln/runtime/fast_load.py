"""Fast loads: code objects of generated Python kept in the local compile cache.

Loading an artifact runs the program's generated Python (wrapper and launchers). Like CPython's
``.pyc`` files, its code objects are kept, marshalled, in this machine's compile cache (never in
artifacts: an artifact holds only sources), keyed by the source text and the interpreter's bytecode
magic. Guard checks need no cache: they are built without ``compile()`` (``kiln.graph.guards_plan``;
earlier versions generated ~130 KB of Python for a mobilenet's 1,400 guards and cached it here).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import marshal
import sys
import types
from collections.abc import Sequence
from typing import Any

from kiln.graph import GuardSet

from .cache import CompileCache, default_cache

logger = logging.getLogger("kiln.runtime")

_MAGIC = importlib.util.MAGIC_NUMBER.hex() + sys.implementation.cache_tag
_CODE_NS = "pycode"


def compile_cached(source: str, filename: str, cache: CompileCache | None = None) -> types.CodeType:
    """``compile(source, filename, 'exec')``, reusing a marshalled code object from the cache."""
    store = cache or default_cache()
    key = f"{_MAGIC}\0{filename}\0{hashlib.sha256(source.encode()).hexdigest()}"
    data = store.get(_CODE_NS, key) if store.enabled else None
    if data is not None:
        try:
            code = marshal.loads(data)
            if isinstance(code, types.CodeType):
                return code
        except (ValueError, EOFError, TypeError):
            pass
        logger.warning("compile cache: code entry for %s does not unmarshal; recompiling", filename)
    code = compile(source, filename, "exec")
    if store.enabled:
        store.put(_CODE_NS, key, marshal.dumps(code))
    return code


def cached_compile(source: Any, filename: str, mode: str, *args: Any, **kwargs: Any) -> Any:
    """The builtin ``compile`` for a program's own namespace: programs that embed sources (the
    autograd wrapper executes its forward and backward parts) reuse cached code objects too."""
    if mode == "exec" and isinstance(source, str) and not args and not kwargs:
        return compile_cached(source, filename)
    return compile(source, filename, mode, *args, **kwargs)


# ---- guard checks ----------------------------------------------------------------------------------

def compile_guards(guards: GuardSet, outputs: Sequence[str] | None = None) -> Any:
    """The guard check of ``guards``; with ``outputs`` it also gathers their values (a list, or
    None when a guard fails). Built as a plan of C-level reads (``kiln.graph.guards_plan``), with no
    ``compile()``, so there is nothing to cache: ~3 ms for 1,400 guards on a new machine."""
    if outputs is None:
        return guards.compile()
    return guards.compile_gather(outputs)
