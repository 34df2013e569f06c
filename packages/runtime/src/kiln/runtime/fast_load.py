"""Fast loads: compiled Python code and compiled guard checks kept in the local compile cache.

Loading an artifact runs three pieces of generated Python: the program (wrapper and launchers), the
input gather and the guard check. Compiling them costs more than a first eager call of a small model
(a mobilenet's 1,400 guards alone take ~60 ms to generate and compile). Like CPython's ``.pyc``
files, the code objects are kept, marshalled, in this machine's compile cache (never in artifacts:
an artifact holds only sources), keyed by the source text and the interpreter's bytecode magic.

Guard checks also cache their generation: the entry, keyed by the guards as data, holds the
generated source and its hoisted constants described as JSON (dtypes, devices, types by name,
tuples of ints...). A guard set whose constants cannot be described is compiled the normal way.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import logging
import marshal
import sys
import types
from typing import Any

import torch

from kiln.graph import GuardSet

from .cache import CompileCache, default_cache

logger = logging.getLogger("kiln.runtime")

_MAGIC = importlib.util.MAGIC_NUMBER.hex() + sys.implementation.cache_tag
_CODE_NS = "pycode"
_GUARD_NS = "guardcheck"


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

def _encode(value: object) -> object:
    """A JSON description of a hoisted guard constant; raises TypeError when there is none."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Size):
        return {"size": [_encode(v) for v in value]}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v) for v in value]}
    if isinstance(value, type):
        module, qual = value.__module__, value.__qualname__
        if "<" not in qual and _resolve(module, qual) is value:
            return {"type": [module, qual]}
    raise TypeError(f"cannot describe guard constant {value!r}")


def _resolve(module: str, qual: str) -> Any:
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def _decode(d: dict) -> object:
    if "v" in d:
        return d["v"]
    if "dtype" in d:
        return getattr(torch, d["dtype"])
    if "device" in d:
        return torch.device(d["device"])
    if "size" in d:
        return torch.Size([int(_decode(v)) for v in d["size"]])  # type: ignore[call-overload]
    if "tuple" in d:
        return tuple(_decode(v) for v in d["tuple"])
    if "list" in d:
        return [_decode(v) for v in d["list"]]
    if "type" in d:
        obj = _resolve(*d["type"])
        if not isinstance(obj, type):
            raise ValueError(f"type {d['type']} is not importable here")
        return obj
    raise ValueError(f"unknown guard constant record {d}")


def _guards_key(guards: GuardSet) -> str:
    rows = [[g.source, g.kind, repr(g.expected)] for g in guards]
    return _MAGIC + hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def compile_guards(guards: GuardSet, cache: CompileCache | None = None) -> Any:
    """``guards.compile()``, from the cache when this guard set was compiled here before."""
    if guards._check:
        return guards._check[0]
    store = cache or default_cache()
    if not store.enabled or not len(guards):
        return guards.compile()
    key = _guards_key(guards)
    entry = store.get_json(_GUARD_NS, key)
    fn: Any
    if isinstance(entry, dict):
        try:
            fn = _rebuild(entry, store)
        except (ValueError, KeyError, TypeError, SyntaxError) as e:
            logger.warning("compile cache: guard check entry does not rebuild (%s); regenerating", e)
        else:
            guards._check.append(fn)
            return fn
    fn = guards.compile()
    try:
        consts = {k: _encode(v) for k, v in fn.__globals__.items() if k.startswith("_c")}
    except TypeError as e:
        logger.debug("guard check not cached: %s", e)
        return fn
    store.put(_CODE_NS, _function_key(fn.__kiln_source__), marshal.dumps(fn.__code__))
    store.put_json(_GUARD_NS, key, {"source": fn.__kiln_source__, "consts": consts})
    return fn


def _function_key(source: str) -> str:
    return f"{_MAGIC}\0<kiln guards: check>\0{hashlib.sha256(source.encode()).hexdigest()}"


def _rebuild(entry: dict, store: CompileCache) -> Any:
    source = entry["source"]
    helpers = GuardSet(()).compile().__globals__  # the fixed helper names (_tensor_ok, _Tensor, ...)
    ns: dict[str, Any] = {k: v for k, v in helpers.items() if k.startswith("_") and k != "__builtins__"}
    ns.update({k: _decode(v) for k, v in entry["consts"].items()})
    ns["__builtins__"] = __builtins__
    data = store.get(_CODE_NS, _function_key(source))
    code = None
    if data is not None:
        with contextlib.suppress(ValueError, EOFError, TypeError):
            code = marshal.loads(data)
    fn: Any
    if isinstance(code, types.CodeType):
        fn = types.FunctionType(code, ns, "check")
    else:
        exec(compile(source, "<kiln guards>", "exec"), ns)  # noqa: S102 - our generated check
        fn = ns["check"]
        store.put(_CODE_NS, _function_key(source), marshal.dumps(fn.__code__))
    fn.__kiln_source__ = source
    return fn
