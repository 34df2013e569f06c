"""The graph-level compile cache: a captured FX graph + its inputs -> the compiled PortableProgram.

Like torch's FX graph cache: a second process compiling the same graph loads the generated program
(wrapper, kernel libraries, the autograd wrapper for training) instead of running autograd, decomp,
lowering, scheduling and code generation again.

Note (soundness): the key holds everything that can change the compiled result —
  * the graph: its code (and every nested GraphModule's), the bytes of its tensor attributes, the
    ``source`` of its placeholders; graphs calling functions outside torch/operator/math/builtins
    are not cached (their bodies are not in the key),
  * each example input: type, shape, stride, storage offset, dtype, device, layout, requires_grad,
    conj/neg bits, whether it is a view or an inference tensor, and which inputs share storage,
  * the backend name and its options, torch's global state (grad mode, autocast, default dtype,
    deterministic algorithms, matmul precision), the number of threads, the ``KILN_*`` and
    ``TRITON_*`` environment variables that are not just logging or cache locations,
  * the compute capability of the CUDA devices the inputs are on,
  * the versions of kiln, torch (with its build tag), triton and Python, the host CPU, and a hash of
    kiln's own source files (so editing the compiler invalidates entries, as in a development tree).
A graph with symbolic sizes (placeholders whose ``meta["val"]`` has SymInt sizes) is keyed on its
symbolic signature instead of the example inputs' sizes: each input's sizes and strides as size
expressions (``s77``, ``4*s77``: ShapeEnv names a symbol after its source, so the names agree across
processes), and the ShapeEnv's guards on those symbols so far; one entry then serves every size.
Compiling a symbolic graph may add guards to the ShapeEnv (autograd's ``s0 != 1`` where a gradient
is summed over a broadcast batch, inductor's ``s0 % 4 == 0``): the entry records them as data, with
the ShapeEnv's ranges and replacements after the compile. A hit checks each recorded guard against
the caller's sizes (a guard they fail makes the hit a miss: the compiled program was built under an
assumption these sizes break), adds them to the caller's ShapeEnv (so they become guards of its
capture entry, as after a compile: a program compiled under ``s0 != 1`` never serves size 1), and
loads the program only when the ShapeEnv then reads as it did after the compile.
Fake or meta tensors with no data to hash, and anything else the key cannot describe make the graph
uncacheable: it compiles as usual and the ``cache`` log says why.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import fx

from kiln.graph import (
    Backend,
    CacheLookup,
    CompiledFn,
    CompiledGraph,
    ExampleInput,
    PortableProgram,
    annotations_of,
    code_environment,
    emit,
    global_state,
    has_symbolic_sizes,
    is_symbolic,
    log,
    py_expr,
    shape_env_of,
)

from .cache import CompileCache, cache_key, default_cache, key_hash
from .code_cache import cached_compile, compile_cached
from .knobs import KNOBS
from .tensors import _raw_bytes
from .triton_binaries import PREFIX as TRITON_PREFIX
from .triton_binaries import collect_triton_binaries, install_triton_binaries

NAMESPACE = "graphs"
_SOURCE_NS = "source_hash"  # stamp of kiln's source files -> their content hash
FORMAT = "kiln-graph-cache/1"
# kiln itself is covered by kiln_source_hash(); user code is not
_PURE_MODULES = ("torch", "operator", "_operator", "math", "builtins", "kiln")


class Uncacheable(Exception):
    """The graph or its inputs hold something the key cannot describe soundly."""


@dataclass(frozen=True, slots=True)
class CachedGraph:
    """A cache hit: the compiled program and the stage texts recorded when it was compiled."""

    program: PortableProgram
    texts: Mapping[str, str]
    backend: str
    shape_guards: tuple[str, ...] = ()  # guards its compile added to the ShapeEnv (srepr text)
    shape_state: tuple[str, ...] | None = None  # the ShapeEnv's ranges and replacements after it


# ---- the key -------------------------------------------------------------------------------------

@functools.cache
def kiln_source_hash() -> str:
    """sha256 over every kiln source file installed here (all stages of the ``kiln`` namespace)."""
    # the ``kiln`` namespace (imported already, as our parent) lists every installed stage's folder
    roots = getattr(sys.modules.get("kiln"), "__path__", None) or [str(Path(__file__).parents[1])]
    return source_hash(roots, default_cache())


def _source_files(roots: Sequence[str]) -> list[tuple[str, str, os.stat_result]]:
    """(root, path relative to it, stat) of every ``*.py`` under ``roots``, in a stable order."""
    found: list[tuple[str, str, os.stat_result]] = []

    def walk(root: str, folder: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        walk(root, entry.path)
                elif entry.name.endswith(".py"):
                    found.append((root, os.path.relpath(entry.path, root), entry.stat()))
    for root in sorted({str(Path(p).resolve()) for p in roots}):
        if os.path.isdir(root):
            walk(root, root)
    found.sort(key=lambda f: (f[0], f[1]))
    return found


def source_hash(roots: Sequence[str], cache: CompileCache) -> str:
    """sha256 over the contents of every ``*.py`` file under ``roots``.

    Why a stamp: reading and hashing kiln's ~200 files would cost every warm start tens of ms. The
    content hash is kept in the compile cache under a stamp of each file's path, size and mtime
    (ns), so a process reads the files again only after one of them changed.
    """
    files = _source_files(roots)
    stamp = hashlib.sha256()
    for root, rel, st in files:
        stamp.update(f"{root}\0{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    stamp_key = "kiln-source-stamp/1\0" + stamp.hexdigest()
    known = cache.get(_SOURCE_NS, stamp_key) if cache.enabled else None
    if known is not None and len(known) == 64 and known.isalnum():
        return known.decode()
    h = hashlib.sha256()
    for root, rel, _ in files:
        h.update(rel.replace(os.sep, "/").encode())
        h.update(Path(root, rel).read_bytes())
    digest = h.hexdigest()
    if cache.enabled:
        cache.put(_SOURCE_NS, stamp_key, digest.encode())
    return digest


def _state() -> list[object]:
    # (TF32 switches are read by the kernels when they run, not baked into generated code)
    return [list(global_state()), torch.get_float32_matmul_precision(), torch.get_num_threads(),
            str(torch.__version__)]


def _gpus(example_inputs: Sequence[Any]) -> list[str]:
    """The compute capability of each CUDA device the inputs are on: generated kernels may use what it has
    (programmatic dependent launch from sm_90), so a cache shared with an older GPU must not serve them."""
    devices = sorted({t.device.index or 0 for t in example_inputs
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    if not devices or not torch.cuda.is_available():
        return []
    return [f"cuda:{d} sm_{''.join(map(str, torch.cuda.get_device_capability(d)))}" for d in devices]


def _tensor_record(t: torch.Tensor, storages: dict[object, int], index: int,
                   symbolic_ok: bool = False) -> list[object]:
    if not symbolic_ok and any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride())):
        raise Uncacheable("an input has symbolic sizes")
    try:
        ref = t.untyped_storage()._cdata if t.device.type != "meta" else None
    except Exception:  # noqa: BLE001 - fake tensors and other subclasses
        ref = None
    alias = storages.setdefault(ref, index) if ref is not None else index
    return ["tensor", f"{type(t).__module__}.{type(t).__qualname__}", list(t.shape), list(t.stride()),
            int(t.storage_offset()), str(t.dtype), str(t.device), str(t.layout),
            bool(t.requires_grad), bool(t.is_conj()), bool(t.is_neg()), bool(t._is_view()),
            bool(t.is_inference()), alias]


def _symbolic_record(record: list[object], val: torch.Tensor) -> list[object]:
    """A tensor's record with its sizes and strides as the placeholder's size expressions."""
    out = list(record)
    out[2] = [str(s) for s in val.shape]
    out[3] = [str(s) for s in val.stride()]
    out[4] = str(val.storage_offset())
    return out


def _shape_env_record(env: Any) -> list[object]:
    return [*sorted({py_expr(g.expr) for g in env.guards}),
            *sorted(f"{k}:{v.lower}..{v.upper}" for k, v in env.var_to_range.items())]


def _input_records(example_inputs: Sequence[Any], vals: Sequence[Any] | None = None) -> list[object]:
    """Records of the inputs; ``vals``: the placeholders' symbolic values of a symbolic graph."""
    storages: dict[object, int] = {}
    out: list[object] = []
    for i, x in enumerate(example_inputs):
        val = vals[i] if vals is not None else None
        if isinstance(val, torch.SymInt) and is_symbolic(val):
            out.append(["symint", str(val.node.expr)])
        elif isinstance(val, torch.SymFloat) and is_symbolic(val):  # a float argument: keyed by symbol, never value
            out.append(["symfloat", str(val.node.expr)])
        elif isinstance(x, torch.Tensor) and isinstance(val, torch.Tensor) and has_symbolic_sizes(val):
            out.append(_symbolic_record(_tensor_record(x, storages, i, symbolic_ok=True), val))
        elif isinstance(x, torch.Tensor):
            out.append(_tensor_record(x, storages, i))
        elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Uncacheable(f"input {i} is a symbolic {type(x).__name__}")
        elif x is None or isinstance(x, (bool, int, float, str)):
            out.append([type(x).__name__, x])
        else:
            raise Uncacheable(f"input {i} is a {type(x).__name__}")
    return out


def _tensor_digest(t: torch.Tensor) -> str:
    if t.device.type == "meta" or type(t).__name__ == "FakeTensor":
        raise Uncacheable("the graph holds a fake or meta tensor constant")
    return hashlib.sha256(_raw_bytes(t)).hexdigest()


def _check_targets(gm: fx.GraphModule, where: str) -> None:
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        # method descriptors (torch.Tensor.add) name their class's module, not their own
        module = (getattr(target, "__module__", None)
                  or getattr(getattr(target, "__objclass__", None), "__module__", None) or "")
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            continue
        if module.split(".")[0] not in _PURE_MODULES:
            raise Uncacheable(f"{where} calls {getattr(target, '__qualname__', target)!r} from "
                              f"{module or 'an unknown module'}, whose code is not in the key")


def _graph_records(gm: fx.GraphModule) -> list[object]:
    records: list[object] = []
    for name, mod in gm.named_modules():
        if not isinstance(mod, fx.GraphModule):
            if name and next(mod.parameters(recurse=False), None) is not None:
                raise Uncacheable(f"submodule {name!r} is not a GraphModule")
            continue
        _check_targets(mod, f"graph {name or '<root>'}")
        records.append([name, mod.code, repr(annotations_of(mod))])
        for node in mod.graph.nodes:
            if node.op == "placeholder":
                records.append(["placeholder", node.name])
            elif node.op == "get_attr":
                value: Any = mod
                for part in str(node.target).split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor):
                    records.append(["const", node.target, _tensor_record(value, {}, 0),
                                    _tensor_digest(value)])
                elif not isinstance(value, fx.GraphModule):
                    records.append(["attr", node.target, repr(value)])
    return records


def graph_key(gm: fx.GraphModule, example_inputs: Sequence[Any], *, backend: str,
              options: object) -> str:
    """The cache key of compiling ``gm`` for ``example_inputs``; raises Uncacheable."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    shape_env = shape_env_of(vals)
    symbolic = shape_env is not None and len(vals) == len(example_inputs)
    parts = {"format": FORMAT, "backend": backend, "options": repr(options),
             "graph": _graph_records(gm), "inputs": _input_records(example_inputs, vals if symbolic else None),
             # the environment variables declared to change code (kiln.graph.knobs.ENVIRONMENT)
             "state": _state(), "env": code_environment(), "kiln_sources": kiln_source_hash(),
             "gpus": _gpus(example_inputs)}
    if symbolic:
        parts["shape_env"] = _shape_env_record(shape_env)
    return cache_key(json.dumps(parts, sort_keys=True, default=repr))


def _shape_env(gm: fx.GraphModule) -> Any:
    """The graph's ShapeEnv (None for a static graph)."""
    return shape_env_of([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])


def _env_state(env: Any) -> list[str]:
    """What a compile's guards leave in a ShapeEnv: the symbols' ranges and replacements."""
    return [*(f"{k}:{v.lower}..{v.upper}" for k, v in sorted(env.var_to_range.items(), key=lambda kv: str(kv[0]))),
            *sorted(f"{k}->{v}" for k, v in env.replacements.items())]


# ---- guards a compile added, as data -------------------------------------------------------------
# Each is stored as ``sympy.srepr`` text and read back over the caller's own symbols (looked up by
# name: ShapeEnv names a symbol after its source, so names agree across processes, as the key relies on).

def _guard_text(expr: Any) -> str:
    import sympy  # only for symbolic graphs (torch imported it for their ShapeEnv): static ones do not pay it
    return str(sympy.srepr(expr))


@functools.cache
def _expr_namespace() -> dict[str, Any]:
    import sympy  # as in _guard_text
    from torch.utils._sympy import functions as size_functions
    ns = {k: v for k, v in vars(sympy).items() if not k.startswith("_")}
    ns.update({k: v for k, v in vars(size_functions).items() if not k.startswith("_")})
    return ns


def parse_guard(text: str, env: Any) -> Any:
    """A recorded guard's sympy expression over ``env``'s symbols; raises ValueError."""
    symbols = {str(s): s for s in (*_hints(env), *env.var_to_range)}

    def symbol(name: str, **_: Any) -> Any:
        if name not in symbols:
            raise ValueError(f"symbol {name} is not in this graph's ShapeEnv")
        return symbols[name]
    try:
        return eval(text, {"__builtins__": {}}, {**_expr_namespace(), "Symbol": symbol})  # noqa: S307 - srepr text we wrote
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - an unreadable record is a miss, never trusted
        raise ValueError(f"guard {text!r} is not readable ({type(e).__name__}: {e})") from e


def _hints(env: Any) -> Mapping[Any, Any]:
    """The ShapeEnv's symbol -> example value (``backed_var_to_val`` in newer torch)."""
    return getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}


def _holds_for_example(env: Any, expr: Any) -> bool:
    """Whether ``expr`` is true at the sizes this graph was captured with (ShapeEnv's hints)."""
    try:
        return bool(expr.xreplace(_hints(env))) is True
    except TypeError:  # a symbol without a value (unbacked): not known to hold
        return False


def replay_guards(env: Any, texts: Sequence[str], state: Sequence[str] | None) -> str | None:
    """Add the recorded guards ``texts`` to ``env``; None when done, else why the entry does not
    serve these sizes (nothing is added then, unless the ShapeEnv ends up unlike ``state``)."""
    exprs = []
    for text in texts:
        try:
            expr = parse_guard(text, env)
        except ValueError as e:
            return str(e)
        if not _holds_for_example(env, expr):
            return f"it was compiled under {py_expr(expr)}, which these sizes fail"
        exprs.append(expr)
    for expr in exprs:
        env.evaluate_expr(expr)
    if state is not None and _env_state(env) != list(state):
        return "its guards leave the shape environment unlike after its compile"
    return None


# ---- the value -----------------------------------------------------------------------------------

def encode_entry(program: PortableProgram, texts: Mapping[str, str], backend: str,
                 shape_guards: Sequence[str] = (), shape_state: Sequence[str] | None = None) -> bytes:
    names = sorted(program.files)
    header = {"format": FORMAT, "backend": backend, "source": program.source,
              "requires": list(program.requires), "texts": dict(texts),
              "shape_guards": list(shape_guards), "shape_state": shape_state,
              "files": [[n, len(program.files[n])] for n in names]}
    return b"".join([json.dumps(header).encode(), b"\n", *(bytes(program.files[n]) for n in names)])


def decode_entry(data: bytes) -> CachedGraph:
    end = data.find(b"\n")
    header = json.loads(data[:end])
    if header.get("format") != FORMAT:
        raise ValueError(f"entry format {header.get('format')!r}, expected {FORMAT!r}")
    files: dict[str, bytes] = {}
    pos = end + 1
    for name, size in header["files"]:
        files[name] = data[pos:pos + size]
        pos += size
    if pos != len(data):
        raise ValueError("file sizes do not add up to the entry's length")
    program = PortableProgram(header["source"], files, tuple(header["requires"]))
    state = header.get("shape_state")
    return CachedGraph(program, dict(header["texts"]), str(header["backend"]),
                       tuple(str(g) for g in header.get("shape_guards", ())),
                       None if state is None else tuple(str(x) for x in state))


def program_callable(program: PortableProgram, cache: CompileCache | None = None,
                     name: str = "kiln_cached_graph") -> Callable[..., Any]:
    """``program`` executed as a module; returns ``fn(*args)`` calling its ``call(list(args))``."""
    cache = cache or default_cache()
    digest = key_hash(program.source + "\0" + "\0".join(sorted(program.files)))
    files_dir = ""
    if program.files:
        files_dir = str(cache.materialize_tree(
            "graph_files", digest + "".join(hashlib.sha256(program.files[n]).hexdigest()
                                            for n in sorted(program.files)), program.files))
    module = types.ModuleType(f"{name}_{digest[:16]}")
    filename = f"<{name} {digest[:16]}>"
    module.__dict__.update({"FILES": dict(program.files), "FILES_DIR": files_dir, "__file__": filename,
                            "compile": cached_compile})
    exec(compile_cached(program.source, filename, cache), module.__dict__)  # noqa: S102 - ours
    call = module.__dict__["call"]

    def fn(*args: Any) -> Any:
        return call(list(args))
    fn.kiln_module = module  # type: ignore[attr-defined]
    return fn


class GraphCache:
    """Looks compiled graphs up by ``graph_key`` in a CompileCache (``default_cache()``)."""

    def __init__(self, cache: CompileCache | None = None) -> None:
        self._cache = cache

    @property
    def store(self) -> CompileCache:
        return self._cache or default_cache()

    def load(self, key: str) -> CachedGraph | None:
        data = self.store.get(NAMESPACE, key)
        if data is None:
            return None
        try:
            return decode_entry(data)
        except (ValueError, KeyError, TypeError) as e:
            log("cache").warning("graph cache: entry %s is not readable (%s); recompiling",
                                 key_hash(key)[:16], e)
            return None

    def save(self, key: str, program: PortableProgram, texts: Mapping[str, str], backend: str,
             shape_guards: Sequence[str] = (), shape_state: Sequence[str] | None = None) -> bool:
        return self.store.put(NAMESPACE, key, encode_entry(program, texts, backend, shape_guards, shape_state))


def cached_backend(fn: Backend, name: str, options: object, *, cache: CompileCache | None = None) -> Backend:
    """Wrap a backend so each graph it compiles is looked up in, and stored to, the graph cache.

    ``options`` is everything the backend was configured with (part of the key by its ``repr``).
    A hit returns a CompiledGraph running the cached program; a miss compiles with ``fn`` and stores
    its portable program. Each outcome is one line of the ``cache`` log.
    """
    graphs = GraphCache(cache)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput]) -> CompiledFn:
        if not KNOBS.graph_cache or not graphs.store.enabled:
            return fn(gm, example_inputs)
        try:
            key = graph_key(gm, example_inputs, backend=name, options=options)
        except Uncacheable as e:
            log("cache").info("graph cache bypass (%s): %s", name, e)
            return fn(gm, example_inputs)
        short = key_hash(key)[:16]
        hit = graphs.load(key)
        if hit is not None:
            loaded = _from_hit(hit, gm, graphs, name, short, "", key)
            if loaded is not None:
                return loaded
        # Note: processes sharing the cache (the ranks of a distributed job) compile each graph
        # once: the first takes the key's lock and compiles, the others wait and load its entry.
        t0 = time.perf_counter()
        with graphs.store.lock(f"graph:{key}"):
            waited = time.perf_counter() - t0
            hit = graphs.load(key) if hit is None else None
            if hit is not None:
                loaded = _from_hit(hit, gm, graphs, name, short,
                                   f"; compiled by another process while this one waited {waited:.1f} s", key)
                if loaded is not None:
                    return loaded
            return _compile_and_store(fn, gm, example_inputs, graphs, key, name, short)
    backend.__name__ = getattr(fn, "__name__", name)
    backend.__wrapped__ = fn  # type: ignore[attr-defined]
    return backend


# graphs compiled in this process whose program improves as they run (a tiered wrapper: the C++ one built
# once the graph is hot), by key: a hit on the same key (a frame recompiled into the same graph, a second
# model of the same architecture) shares that graph, its call count and its C++ wrapper, instead of
# loading the Python program of the entry, which would never move
_IMPROVING: dict[str, weakref.ref] = {}


def forget_live_graphs() -> None:
    """Later hits load their entries instead of sharing graphs compiled before (``kiln.reset()``)."""
    _IMPROVING.clear()


def _from_hit(hit: CachedGraph, gm: fx.GraphModule, graphs: GraphCache, name: str, short: str,
              note: str, key: str = "") -> CompiledGraph | None:
    """The compiled graph of a cache entry, or None (logged) when it fails to load or does not serve
    these sizes (its compile's guards are added to the graph's ShapeEnv when it does)."""
    env = _shape_env(gm)
    if env is not None:
        why = replay_guards(env, hit.shape_guards, hit.shape_state)
        if why is not None:
            log("cache").info("graph cache entry %s (%s) not used: %s; recompiling", short, name, why)
            return None
    elif hit.shape_guards:
        log("cache").warning("graph cache: entry %s has shape guards but the graph is static; recompiling", short)
        return None
    live = _IMPROVING.get(key)
    fn = live() if live is not None else None
    if fn is not None:
        log("cache").info("graph cache hit %s (%s, %d nodes): the graph compiled in this process%s", short, name,
                          len(gm.graph.nodes), note)
        emit(CacheLookup(name, True, short))
        return CompiledGraph(fn, hit.backend, dict(hit.texts), hit.program)
    try:
        program, kernels = _install_kernels(hit.program, short)
        call = program_callable(program, graphs.store)
    except Exception as e:  # noqa: BLE001 - a bad entry is rebuilt, never trusted
        log("cache").warning("graph cache: entry %s failed to load (%s: %s); recompiling",
                             short, type(e).__name__, e)
        return None
    log("cache").info("graph cache hit %s (%s, %d nodes%s%s)", short, name, len(gm.graph.nodes), kernels, note)
    emit(CacheLookup(name, True, short))
    return CompiledGraph(call, hit.backend, dict(hit.texts), program)


def _compile_and_store(fn: Callable[[fx.GraphModule, Sequence[Any]], Any], gm: fx.GraphModule,
                       example_inputs: Sequence[Any], graphs: GraphCache, key: str, name: str, short: str) -> Any:
    emit(CacheLookup(name, False, short))
    env = _shape_env(gm)
    guards_before = len(env.guards) if env is not None else 0
    compiled = fn(gm, example_inputs)
    added = [_guard_text(g.expr) for g in env.guards[guards_before:]] if env is not None else []
    state = _env_state(env) if env is not None else None
    if not isinstance(compiled, CompiledGraph) or compiled.portable is None:
        log("cache").info("graph cache miss %s (%s): not stored, the backend gave no portable "
                          "program", short, name)
        return compiled
    texts = dict(compiled.texts)
    stored = graphs.save(key, compiled.portable, texts, compiled.backend, added, state)
    log("cache").info("graph cache miss %s (%s): compiled%s%s", short, name,
                      " and stored" if stored else ", not stored (cache not writable)",
                      f" with the {len(added)} shape guard(s) its compile added" if added else "")
    if stored and compiled.improves:
        try:
            _IMPROVING[key] = weakref.ref(compiled.fn)
        except TypeError:  # a callable without weak references: hits load the entry
            pass
    if stored and compiled.later is not None:
        # a better program ready later (a C++ wrapper built in the background): later processes load it
        def store_later(program: PortableProgram) -> None:
            if graphs.save(key, program, texts, compiled.backend, added, state):
                log("cache").info("graph cache entry %s (%s): replaced by the program built after the compile",
                                  short, name)
        compiled.later(store_later)
    if stored and compiled.portable.triton_modules:
        return _store_kernels_after_first_call(compiled, graphs, key, compiled.portable, texts, short,
                                               added, state)
    return compiled


# ---- Triton binaries in entries ------------------------------------------------------------------
# Triton compiles a kernel on its first launch, after the backend returned, so a miss stores the
# program first and adds the compiled kernels' binaries to the entry after the graph's first call.
# A hit installs them into Triton's cache before the program loads: a warm process compiles no
# Triton kernel (each ``cache`` log line says how many kernels came from the entry).

def _install_kernels(program: PortableProgram, short: str) -> tuple[PortableProgram, str]:
    kernels = {n: d for n, d in program.files.items() if n.startswith(TRITON_PREFIX)}
    if not kernels:
        return program, ""
    installed = install_triton_binaries(kernels, f"graph cache entry {short}")
    rest = {n: d for n, d in program.files.items() if not n.startswith(TRITON_PREFIX)}
    return (replace(program, files=rest),
            f"; {installed} compiled Triton kernel(s) installed from the entry, none compiled")


def _store_kernels_after_first_call(compiled: CompiledGraph, graphs: GraphCache, key: str,
                                    program: PortableProgram, texts: Mapping[str, str],
                                    short: str, shape_guards: Sequence[str],
                                    shape_state: Sequence[str] | None) -> CompiledGraph:
    run = compiled.fn
    pending = True

    def fn(*args: Any) -> Any:
        nonlocal pending
        out = run(*args)
        if pending:
            pending = False
            try:
                binaries = collect_triton_binaries(program.triton_modules)
            except Exception as e:  # noqa: BLE001 - shipping binaries is an optimisation
                log("cache").info("graph cache %s: Triton binaries not collected (%s: %s)", short,
                                  type(e).__name__, e)
                binaries = {}
            if binaries:
                files = {**program.files, **binaries}
                graphs.save(key, replace(program, files=files), texts,
                            compiled.backend, shape_guards, shape_state)
                log("cache").info("graph cache %s: stored %d Triton binary file(s) after the first "
                                  "call; a warm process will not compile these kernels", short,
                                  len(binaries))
        return out
    return replace(compiled, fn=fn)
