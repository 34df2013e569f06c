"""Compiled Triton kernels handed to triton's in-memory kernel cache at load: no compile, no cache lookup.

A ``@triton.jit`` function keeps its compiled kernels per device in ``fn.device_caches[device][0]``,
a dict from triton's specialisation key (a string: argument types, alignments, constexpr values and
launch options) to the ``CompiledKernel``. Its first launch in a new process misses that dict and
calls ``triton.compile``, which hashes triton's own sources and ``libtriton.so`` (``triton_key``,
0.4 s once per process on the H200 host) just to find the binary kiln already put in its disk cache.

So at save (``kernel_records``) kiln records, per compiled kernel, what triton needs to rebuild the
object -- the ASTSource's signature, constexprs and attrs as JSON (no pickle), the key it is filed
under, its hash and its cache folder's files -- and at load (``register_records`` from
``install_triton_binaries``, then ``adopt_module`` when the wrapper imports its kernel module) builds
``CompiledKernel(ASTSource(fn, signature, constexprs, attrs), metadata_group, hash)`` (a constructor
that is the same from triton 3.0 to 3.9) and files it under the same key. The first launch then
takes triton's own path (``fn[grid](...)``): its key finds the kernel; a call that specialises
otherwise (another alignment, another int) misses it and compiles as before. Nothing is trusted that
triton would not have chosen: a record is used only for the same triton release, the same GPU
target, the same cache-invalidating environment variables, with every file present; anything else
is skipped with a ``perf_hints`` log line (triton then finds or compiles the kernel as before).

A record also carries the description of the launch that compiled the kernel (``launch``: constexprs,
warps, stages, triton's option knobs, and per argument what triton specialises on), noted by the wrappers'
launcher (inductor codegen/triton/launcher.py) in ``triton_notes.KERNEL_NOTES``. The rebuilt kernel gets
the same note, and a launcher whose first
call is described exactly so binds the binary directly, without triton's ``JITFunction.run`` (whose
first specialisation in a process imports triton's gluon packages: 0.1 s of a GPT-2 warm start).

``count_triton_work()`` counts triton cache lookups, ``triton_key`` calls and host-compiler (gcc)
builds while it is active: the load profile and tests use it to show what a load did.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.graph import log

from .triton_notes import KERNEL_NOTES, LaunchRecord

FORMAT = 1
RECORDS_PREFIX = "triton/kernels."  # artifact files triton/kernels.<digest>.json (one folder up from binaries)
_JSON_SCALARS = (bool, int, float, str, type(None))


# ---- save: what each compiled kernel needs to be rebuilt ----------------------------------------

def _jsonable(value: Any) -> Any:
    """Signature values and attrs as JSON (tuples become lists); ValueError for anything else."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, _JSON_SCALARS):
        return value
    raise ValueError(f"{type(value).__name__} value {value!r}")


def _tuples(value: Any) -> Any:
    """Back from JSON: lists become tuples again (triton's signatures and paths are tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def kernel_record(module: str, function: str, key: Any, kernel: Any) -> dict[str, Any] | None:
    """One compiled kernel as JSON data, or None when it holds something JSON cannot carry (then
    its binary still ships, and triton finds it in its disk cache after a lookup)."""
    try:
        src, group = kernel.src, dict(kernel.metadata_group)
        if not isinstance(key, str) or not group or not isinstance(kernel.hash, str):
            return None
        paths = {child: Path(p) for child, p in group.items()}
        folders = {p.parent.name for p in paths.values()}
        target = kernel.metadata.target
        constants = [[list(k), v] for k, v in getattr(src, "constants", {}).items()]
        if len(folders) != 1 or any(not isinstance(v, _JSON_SCALARS) for _, v in constants):
            return None
        record = {"module": module, "function": function, "key": key, "hash": kernel.hash,
                  "folder": folders.pop(), "files": {c: p.name for c, p in paths.items()},
                  "signature": {k: _jsonable(v) for k, v in src.signature.items()},
                  "constants": constants,
                  "attrs": [[list(k), _jsonable(v)] for k, v in (getattr(src, "attrs", None) or {}).items()],
                  "target": [target.backend, target.arch, target.warp_size]}
    except (AttributeError, TypeError, ValueError):
        return None
    launch = _launch_description(kernel)
    if launch is not None:
        record["launch"] = launch
    return record


def _launch_description(kernel: Any) -> list[Any] | None:
    """What the kiln launch that compiled ``kernel`` passed (its ``LaunchRecord``, noted by the wrappers'
    ``_KilnLaunch``, codegen/triton/launcher.py), as JSON data; None when not noted. At load it lets a
    launcher described the same way bind the binary without triton's ``run``."""
    record = KERNEL_NOTES.launch(kernel)
    return record.as_data() if record is not None else None


def records_file(records: list[dict[str, Any]]) -> dict[str, bytes]:
    """The artifact file carrying ``records`` (empty when there are none)."""
    if not records:
        return {}
    import hashlib

    import triton

    data = json.dumps({"format": FORMAT, "triton": triton.__version__, "env": _env_vars(),
                       "kernels": records}).encode()  # key order kept: a signature is positional
    return {f"{RECORDS_PREFIX}{hashlib.sha256(data).hexdigest()[:16]}.json": data}


def _env_vars() -> dict[str, Any]:
    """triton's cache-invalidating environment variables (part of its disk cache key, not of the
    in-memory one: a binary built under other values must not be reused)."""
    with contextlib.suppress(Exception):
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return {str(k): v for k, v in get_cache_invalidating_env_vars().items()}
    return {}


# ---- the C launcher triton <= 3.6 builds per kernel signature --------------------------------------

LAUNCHER_NAME = "__triton_launcher"  # the module name triton's CUDA launcher is built under


def launcher_file(record: Mapping[str, Any], metadata: Any) -> tuple[str, str, str] | None:
    """(cache folder, file name, C source) of the launcher triton <= 3.6 builds for the kernel of
    ``record`` when a load launches it -- computed from the record itself, as ``_adopt`` rebuilds the
    kernel (``CudaLauncher(src, metadata)`` -> ``make_launcher`` -> ``compile_module_from_src``, whose
    cache key is the source and the platform). None for a triton without per-signature launchers or
    whose launcher cache is keyed otherwise (the kernel then still launches: triton builds or finds it)."""
    try:
        import hashlib
        import sysconfig

        from triton.backends.nvidia import driver as nvidia_driver
        from triton.runtime import build

        make_launcher = getattr(nvidia_driver, "make_launcher", None)
        platform_key = getattr(build, "platform_key", None)
        if make_launcher is None or platform_key is None:
            return None
        signature = {str(k): _tuples(v) for k, v in record["signature"].items()}
        constants = {_tuples(k): v for k, v in record["constants"]}  # (unused by 3.6's make_launcher)
        source = make_launcher(constants, signature, getattr(metadata, "tensordesc_meta", None))
        folder = _cache_folder(hashlib.sha256((source + platform_key()).encode("utf-8")).hexdigest())
        return folder, f"{LAUNCHER_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}", source
    except Exception:  # noqa: BLE001 - another triton layout: no prediction, triton's own path
        return None


def _cache_folder(key: str) -> str:
    """The folder triton's cache manager files ``key`` (a hex digest) under: base32 of its bytes since
    triton 3.0 (``get_cache_manager(key)`` -> ``_base32``), the key itself where there is no such step."""
    from triton.runtime import cache

    to_folder = getattr(cache, "_base32", None)
    return str(to_folder(key)) if callable(to_folder) else key


def _launcher_missing(p: Pending, kernel: Any) -> str:
    """'' when the launcher the kernel will need is in the Triton cache (or this triton needs none)."""
    wanted = launcher_file(p.record, kernel.metadata)
    if wanted is None or (p.root / wanted[0] / wanted[1]).is_file():
        return ""
    return f"{p.record.get('function')} (launcher {wanted[0][:16]})"


# ---- load: records waiting for their kernel module ----------------------------------------------

@dataclass(frozen=True, slots=True)
class Pending:
    record: Mapping[str, Any]
    root: Path  # the Triton cache directory the binaries were installed into
    where: str  # the artifact or cache entry, for log lines


_LOCK = threading.Lock()
_PENDING: dict[str, list[Pending]] = {}  # kernel module name -> records not yet adopted


def register_records(files: Mapping[str, bytes], root: Path, where: str) -> int:
    """Read the artifact's record files; each kernel is handed to triton when its module is imported
    (at once when it already is). Returns how many records were accepted."""
    import sys

    accepted: dict[str, list[Pending]] = {}
    for name, data in files.items():
        if not (name.startswith(RECORDS_PREFIX) and name.endswith(".json") and name.count("/") == 1):
            continue
        try:
            doc = json.loads(data)
            reason = _mismatch(doc)
        except (ValueError, TypeError, AttributeError) as e:
            reason = f"unreadable record file {name} ({type(e).__name__}: {e})"
        if reason:
            log("perf_hints").info("%s: Triton kernels are not preloaded (%s); triton looks them up in "
                                   "its cache on first launch", where, reason)
            continue
        for rec in doc["kernels"]:
            if isinstance(rec, dict) and isinstance(rec.get("module"), str):
                accepted.setdefault(rec["module"], []).append(Pending(rec, root, where))
    with _LOCK:
        for module, items in accepted.items():
            _PENDING.setdefault(module, []).extend(items)
    for module in accepted:
        loaded = sys.modules.get(module)
        if loaded is not None:
            adopt_module(loaded)
    return sum(len(v) for v in accepted.values())


def _mismatch(doc: Any) -> str:
    """Why these records cannot be used in this process ('' when they can)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("kernels"), list):
        return "record format not understood"
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    if doc.get("triton") != triton.__version__:
        return f"built with triton {doc.get('triton')}, this is triton {triton.__version__}"
    if doc.get("env", {}) != _env_vars():
        return "triton's cache-invalidating environment variables differ from the build's"
    with contextlib.suppress(Exception):
        from triton import knobs

        if knobs.compilation.always_compile or knobs.compilation.override:
            return "TRITON_ALWAYS_COMPILE or TRITON_KERNEL_OVERRIDE is set"
    return ""


def pending_modules() -> list[str]:
    with _LOCK:
        return sorted(_PENDING)


def adopt_module(module: Any) -> int:
    """File the pending records of ``module`` (a kernel module just imported) into triton's kernel
    caches. Never raises: whatever cannot be adopted is compiled or looked up by triton as before.
    Called by the generated wrappers' kernel loader (codegen/triton/wrapper.py LOADER) when this
    module is imported in the process, and by ``register_records``."""
    with _LOCK:
        items = _PENDING.pop(getattr(module, "__name__", ""), None)
    if not items:
        return 0
    try:
        from triton.compiler import ASTSource, CompiledKernel
        from triton.runtime import driver

        device = driver.active.get_current_device()
    except Exception as e:  # noqa: BLE001 - no driver (no GPU), another triton layout: triton's path
        log("perf_hints").info("%s: Triton kernels are not preloaded (%s: %s)", items[0].where, type(e).__name__, e)
        return 0
    adopted, skipped = 0, []
    no_launcher: list[str] = []
    for p in items:
        try:
            why = _adopt(module, p, device, ASTSource, CompiledKernel, no_launcher)
        except Exception as e:  # noqa: BLE001 - never a crash: triton compiles or looks it up
            why = f"{type(e).__name__}: {e}"
        if why:
            skipped.append(f"{p.record.get('function')}: {why}")
        else:
            adopted += 1
    if skipped:
        log("perf_hints").info("%s: %d Triton kernel(s) not preloaded, triton finds or compiles them on "
                               "first launch (%s)", items[0].where, len(skipped), "; ".join(skipped[:3]))
    if no_launcher:
        log("perf_hints").info("%s: the artifact carries no C launcher for %d preloaded Triton kernel(s): "
                               "triton builds each with the host compiler at its first launch (%s)",
                               items[0].where, len(no_launcher), "; ".join(no_launcher[:3]))
    log("cache").info("%s: %d compiled Triton kernel(s) of %s handed to triton (no compile, no cache lookup)",
                      items[0].where, adopted, getattr(module, "__name__", "?"))
    return adopted


def _adopt(module: Any, p: Pending, device: int, ast_source: Any, compiled_kernel: Any,
           no_launcher: list[str] | None = None) -> str:
    """One record into its function's kernel cache; '' when done, else why not. A kernel whose C
    launcher (triton <= 3.6) is not in the cache is named in ``no_launcher`` (a gcc build to come)."""
    rec = p.record
    fn: Any = getattr(module, str(rec["function"]), None)
    while fn is not None and not hasattr(fn, "device_caches") and hasattr(fn, "fn"):
        fn = fn.fn  # autotuner / heuristics wrappers, as collected (triton_binaries._jit_functions)
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        return "not a triton JIT function with per-device kernel caches"
    entry = caches[device]
    kernel_cache, target = entry[0], entry[2]
    if [target.backend, target.arch, target.warp_size] != list(rec["target"]):
        return f"built for {rec['target']}, this GPU is {[target.backend, target.arch, target.warp_size]}"
    key = rec["key"]
    launch = LaunchRecord.of(rec.get("launch"))
    if key in kernel_cache:
        KERNEL_NOTES.note_launch(kernel_cache[key], launch)
        KERNEL_NOTES.mark_preloaded(fn)
        return ""
    folder = p.root / str(rec["folder"])
    group = {str(child): str(folder / str(name)) for child, name in rec["files"].items()}
    if not all(Path(path).is_file() for path in group.values()):
        return f"binary files missing in {folder}"
    signature = {str(k): _tuples(v) for k, v in rec["signature"].items()}
    constants = {_tuples(k): v for k, v in rec["constants"]}
    attrs = {_tuples(k): v for k, v in rec["attrs"]}
    kernel = compiled_kernel(ast_source(fn, signature, constants, attrs), group, rec["hash"])
    expected = getattr(getattr(fn, "fn", None), "__name__", None)
    if expected is not None and kernel.metadata.name != expected:
        return f"binary is for kernel {kernel.metadata.name!r}"
    kernel_cache[key] = kernel
    KERNEL_NOTES.note_launch(kernel, launch)  # the wrapper's launcher may bind it on its first call
    KERNEL_NOTES.mark_preloaded(fn)  # the wrapper's precompile leaves it alone (triton_compile.py)
    if no_launcher is not None:
        with contextlib.suppress(Exception):  # a diagnostic only: the kernel is filed either way
            missing = _launcher_missing(p, kernel)
            if missing:
                no_launcher.append(missing)
    return ""


# ---- counting triton's work (profiles and tests) --------------------------------------------------

@dataclass
class TritonWork:
    cache_lookups: int = 0  # triton.compile's disk cache key computations (each needs triton_key)
    triton_key: int = 0  # calls of triton_key (the first in a process hashes triton itself: ~0.4 s)
    host_builds: int = 0  # C modules built with the host compiler (triton <= 3.6 launchers, driver helpers)
    details: list[str] = field(default_factory=list)  # which kernel each lookup / build was for

    def as_text(self) -> str:
        text = (f"{self.cache_lookups} triton cache lookup(s), {self.triton_key} triton_key call(s), "
                f"{self.host_builds} gcc build(s)")
        return text + "".join(f"\n    {d}" for d in self.details[:20])


def _what(field_name: str, args: tuple) -> str:
    """A line naming what a counted call was for: the kernel looked up, or the module gcc built and
    (for a launcher) the kernel it was built for, found in the caller's frames."""
    import sys

    if field_name == "cache_lookups":
        return f"cache lookup: kernel {getattr(args[0], 'name', '?') if args else '?'}"
    if field_name != "host_builds":
        return ""
    frame: Any = sys._getframe(2)
    kernel = "?"
    for _ in range(8):
        if frame is None:
            break
        meta = frame.f_locals.get("metadata")
        if hasattr(meta, "name"):
            kernel = f"{meta.name} (signature {getattr(frame.f_locals.get('signature'), 'values', lambda: '?')()})"
            break
        frame = frame.f_back
    return f"gcc build: {args[0] if args else '?'} for kernel {kernel}{_build_key(args)}"


def _build_key(args: tuple) -> str:
    """The Triton cache folder the module being built goes to (its source's key), so a profile line
    can be checked against an artifact's ``triton/<folder>/`` files."""
    with contextlib.suppress(Exception):
        import hashlib

        from triton.runtime.build import platform_key

        source = Path(args[1]).read_text()
        return f" -> triton/{_cache_folder(hashlib.sha256((source + platform_key()).encode('utf-8')).hexdigest())}/"
    return ""


@contextlib.contextmanager
def count_triton_work() -> Iterator[TritonWork]:
    """Count triton's cache lookups, ``triton_key`` calls and gcc builds (any thread) inside."""
    import importlib

    work = TritonWork()
    patches: list[tuple[Any, str, Any]] = []

    def wrap(module_name: str, attr: str, field_name: str) -> None:
        try:
            mod = importlib.import_module(module_name)
        except ImportError:
            return
        original = getattr(mod, attr, None)
        if original is None:
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            setattr(work, field_name, getattr(work, field_name) + 1)
            with contextlib.suppress(Exception):
                line = _what(field_name, args)
                if line:
                    work.details.append(line)
            return original(*args, **kwargs)
        patches.append((mod, attr, original))
        setattr(mod, attr, counted)

    wrap("triton.runtime.cache", "triton_key", "triton_key")
    for name in ("triton.runtime.cache", "triton.compiler.compiler", "triton.runtime.jit"):
        wrap(name, "get_cache_key", "cache_lookups")
    wrap("triton.runtime.build", "_build", "host_builds")
    try:
        yield work
    finally:
        for mod, attr, original in reversed(patches):
            setattr(mod, attr, original)
