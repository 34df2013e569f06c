"""Compiled Triton kernels in artifacts: collected after the kernels ran, installed before a load.

Triton compiles a ``@jit`` kernel on its first launch and keeps the result in its cache directory,
one folder per compilation key (``<TRITON_CACHE_DIR>/<key>/``: the cubin, its JSON metadata, the
PTX/IR stages and a ``__grp__*.json`` listing them). The key covers the kernel source, the target
GPU, the options and triton's own version, so putting a folder back makes Triton load the binary
instead of compiling it — and a folder that does not fit is simply never looked up.

``collect_triton_binaries(program.triton_modules)`` takes the kernel modules a program declares it
loads (``PortableProgram.triton_modules``, set by the code generator), and returns every compiled
kernel's cache folder as artifact files ``triton/<key>/<file>`` (kind ``triton_binary``), with the C launchers and driver helpers triton <= 3.6 builds for them with
the host compiler (a new machine would otherwise run gcc once per kernel signature at first launch). ``install_triton_binaries``
writes them into this process's Triton cache when the artifact was built for this GPU capability and
triton release (``checks.usable_files`` drops them otherwise, with a log line: Triton then rebuilds
from the sources the wrapper carries). We use only Triton's on-disk layout and public attributes of
compiled kernels, not its private loader APIs, which move between releases.

With the folders go records of each kernel (``triton/kernels.<digest>.json``, triton_preload.py):
installing registers them, and when the program imports its kernel module each kernel is filed into
triton's in-memory kernel cache, so a load makes no triton cache lookup (no ``triton_key``) at all.
A kernel compiled but never launched in the saving process gets its C launcher built there (on the
GPU host), so the artifact carries a launcher for every kernel it carries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kiln.graph import log

from .knobs import triton_cache_dir_from_env
from .triton_preload import kernel_record, launcher_file, records_file, register_records

logger = logging.getLogger("kiln.runtime")

PREFIX = "triton/"
MODULE_PREFIX = "kiln_triton_"  # load_triton_module imports kernel text as kiln_triton_<sha256[:32]>


def _jit_functions(module: Any) -> Iterator[tuple[str, Any]]:
    """(attribute name, JIT function) of the module's kernels."""
    for name, value in vars(module).items():
        if isinstance(value, types.ModuleType):
            continue  # triton, tl, torch: not kernels (and their lazy attributes are not probed)
        fn = value
        while fn is not None and not hasattr(fn, "device_caches") and not hasattr(fn, "cache"):
            fn = getattr(fn, "fn", None)  # autotuner / heuristics wrappers
        if fn is not None and (hasattr(fn, "device_caches") or hasattr(fn, "cache")):
            yield name, fn


def _compiled_kernels(fn: Any) -> Iterator[tuple[Any, Any]]:
    """(triton's in-memory key, CompiledKernel) of every kernel ``fn`` compiled in this process."""
    caches = getattr(fn, "device_caches", None)
    if isinstance(caches, Mapping):
        for entry in caches.values():
            table = entry[0] if isinstance(entry, tuple) else entry
            if isinstance(table, Mapping):
                yield from table.items()
        return
    legacy = getattr(fn, "cache", None)  # triton < 3.2: {device: {key: CompiledKernel}}
    if isinstance(legacy, Mapping):
        for table in legacy.values():
            if isinstance(table, Mapping):
                yield from table.items()


def collect_triton_binaries(triton_modules: Sequence[str], modules: Mapping[str, Any] | None = None
                            ) -> dict[str, bytes]:
    """The cache folders of the compiled kernels of ``triton_modules`` (a program's
    ``PortableProgram.triton_modules``), as ``triton/<key>/<file>`` files, their C launchers, and one
    ``triton/kernels.<digest>.json`` of records (triton_preload.py) that let a load hand each kernel
    to triton without a compile or cache lookup."""
    modules = sys.modules if modules is None else modules
    files: dict[str, bytes] = {}
    records: list[dict[str, Any]] = []
    for module_name in dict.fromkeys(triton_modules):
        module = modules.get(module_name)
        if module is None:
            continue  # never loaded (or never launched) in this process: nothing compiled to ship
        for name, fn in _jit_functions(module):
            for key, kernel in _compiled_kernels(fn):
                kernel_files = _kernel_files(kernel)
                if not kernel_files:
                    continue
                files.update(kernel_files)
                record = kernel_record(module_name, name, key, kernel)
                files.update(_launcher_files(kernel, record, files))
                if record is not None:
                    records.append(record)
    if files:
        files.update(_driver_utils_files())
        with contextlib.suppress(ImportError):
            files.update(records_file(records))
    return files


def _launcher_files(kernel: Any, record: Mapping[str, Any] | None = None,
                    shipped: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    """The C launcher triton <= 3.6 needs for ``kernel``: the one its first launch here built, and the
    one a load will look for -- predicted from ``record`` exactly as the load rebuilds the kernel
    (``triton_preload.launcher_file``), found in triton's cache by its key (a compile worker or
    ``triton_compile.prebuild_launchers`` may have built it for another kernel object of this signature), else
    built now when this process has the CUDA driver. So a load never runs gcc for a kernel the artifact
    carries; when it cannot be shipped, a ``perf_hints`` line says which kernel and why."""
    state = getattr(kernel, "__dict__", {})  # not ``kernel.run``: on an unlaunched kernel it loads the binary
    run = state.get("_run") or state.get("run")
    wanted = launcher_file(record, getattr(kernel, "metadata", None)) if record is not None else None
    if wanted is None:  # no prediction (no record, or a triton without per-signature launchers)
        return _host_module_files(run if run is not None else _build_launcher(kernel), "launch")
    files = _host_module_files(run, "launch") if run is not None else {}
    folder, name, source = wanted
    artifact_name = f"{PREFIX}{folder}/{name}"
    if artifact_name in files or (shipped is not None and artifact_name in shipped):
        return files
    if files:  # the launcher this process built is not the one a load computes: ship both
        log("perf_hints").info("Triton kernel %s: the C launcher built here (%s) is not the one a load "
                               "builds (triton/%s/); shipping that one too", (record or {}).get("function"),
                               ", ".join(files), folder)
    path = triton_cache_dir() / folder / name
    why = "" if path.is_file() else _build_launcher_source(source)
    try:
        files[artifact_name] = path.read_bytes()
    except OSError as e:
        log("perf_hints").info(
            "Triton kernel %s: its C launcher (triton/%s/) is not shipped (%s); a load on a new machine "
            "builds it with the host compiler at the kernel's first launch", (record or {}).get("function"),
            folder, why or f"{type(e).__name__}: {e}")
    return files


def _build_launcher(kernel: Any) -> Any:
    active = _cuda_driver()
    if active is None:
        return None
    with contextlib.suppress(Exception):
        return active.launcher_cls(kernel.src, kernel.metadata)
    return None


def _cuda_driver() -> Any:
    """triton's active CUDA driver when this process made one (never made here: a CPU host has none)
    and its triton builds a launcher per signature; else None."""
    with contextlib.suppress(Exception):
        from triton.backends.nvidia import driver as nvidia_driver
        from triton.runtime import driver

        active = getattr(driver, "_active", None)
        if active is not None and hasattr(nvidia_driver, "make_launcher") \
                and type(active).__name__ == "CudaDriver":
            return active
    return None


def _build_launcher_source(source: str) -> str:
    """Build (or find) triton's launcher module for ``source`` into triton's cache, as ``CudaLauncher``
    does; '' when built, else why not."""
    if _cuda_driver() is None:
        return "not in triton's cache, and this process has no CUDA driver to build it"
    try:
        from triton.backends.nvidia import driver as nvidia_driver

        from .triton_preload import LAUNCHER_NAME

        nvidia_driver.compile_module_from_src(src=source, name=LAUNCHER_NAME,
                                              library_dirs=nvidia_driver.library_dirs(),
                                              include_dirs=nvidia_driver.include_dirs,
                                              libraries=nvidia_driver.libraries)
        return ""
    except Exception as e:  # noqa: BLE001 - an optimisation: the load builds it otherwise
        return f"building it failed: {type(e).__name__}: {e}"


def _host_module_files(owner: Any, attr: str) -> dict[str, bytes]:
    """The C extension triton built with the host compiler for ``owner`` (triton <= 3.6 builds a launcher
    per kernel signature, and its CUDA driver helpers, with gcc: 0.25-0.35 s each on a new machine), as
    ``triton/<key>/<name>.so`` -- the folder ``compile_module_from_src`` looks in. Its file name carries
    the Python ABI (``EXT_SUFFIX``) and its key the launcher source and platform, so a process that does
    not fit never looks it up. Nothing for tritons that launch through one generic module."""
    fn = getattr(owner, attr, None)
    path = getattr(getattr(fn, "__self__", None), "__file__", None)
    if not isinstance(path, str) or not path.endswith(".so"):
        return {}
    p = Path(path)
    try:
        if p.parent.parent.resolve() != triton_cache_dir().resolve():
            return {}  # not in triton's cache (a launcher of the installed package): nothing to ship
        return {f"{PREFIX}{p.parent.name}/{p.name}": p.read_bytes()}
    except OSError:
        return {}


def _driver_utils_files() -> dict[str, bytes]:
    """triton's CUDA driver helpers module, when this process made the driver (it launched kernels)."""
    with contextlib.suppress(Exception):
        from triton.runtime import driver

        active = getattr(driver, "_active", None)  # never make a driver here (a CPU host has none)
        utils = getattr(active, "utils", None)
        if utils is not None:
            return _host_module_files(utils, "load_binary")
    return {}


def _kernel_files(kernel: Any) -> dict[str, bytes]:
    """One compiled kernel's cache folder: the files of its metadata group and the group file."""
    paths = [Path(p) for p in (getattr(kernel, "metadata_group", None) or {}).values()]
    if not paths:
        return {}
    folder = paths[0].parent
    paths += sorted(folder.glob("__grp__*.json"))
    out: dict[str, bytes] = {}
    for p in paths:
        try:
            out[f"{PREFIX}{folder.name}/{p.name}"] = p.read_bytes()
        except OSError as e:
            logger.info("Triton binary %s is not readable (%s); the kernel is not shipped", p, e)
            return {}
    return out


def triton_cache_dir() -> Path:
    """Where this process's Triton looks for compiled kernels."""
    with contextlib.suppress(Exception):  # triton >= 3.3 exposes its settings as knobs
        from triton import knobs  # type: ignore[attr-defined]
        if knobs.cache.dir:
            return Path(knobs.cache.dir)
    return triton_cache_dir_from_env()


def install_triton_binaries(files: Mapping[str, bytes], where: str = "<artifact>",
                            cache_dir: Path | None = None) -> int:
    """Write the artifact's ``triton/`` folders into Triton's cache; returns how many kernels.

    Folders already there are kept (Triton wrote them, or an earlier load did). Group files list
    absolute paths, so they are rewritten to the folder they land in. The kernels' records are
    registered for ``triton_preload.adopt_module``.
    """
    folders: dict[str, dict[str, bytes]] = {}
    for name, data in files.items():
        if name.startswith(PREFIX) and name.count("/") == 2:
            _, key, fname = name.split("/")
            folders.setdefault(key, {})[fname] = data
    if not folders:
        return 0
    root = cache_dir or triton_cache_dir()
    installed = 0
    for key, entries in folders.items():
        target = root / key
        if target.is_dir() and (any(n.startswith("__grp__") for n in os.listdir(target))
                                or all((target / n).is_file() for n in entries)):
            installed += 1
            continue
        try:
            _write_folder(target, entries)
            installed += 1
        except OSError as e:
            logger.warning("artifact %s: cannot install Triton binary %s into %s (%s); Triton "
                           "recompiles that kernel from source", where, key, root, e)
    logger.info("artifact %s: %d compiled Triton kernel(s) installed into %s (no recompilation)",
                where, installed, root)
    # each kernel is then handed to triton's in-memory cache when the program imports its module:
    # its first launch neither compiles nor looks the binary up (triton_preload.py)
    register_records(files, root, where)
    return installed


def _write_folder(target: Path, entries: Mapping[str, bytes]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    for fname, data in entries.items():
        if fname.startswith("__grp__"):
            group = json.loads(data)
            group["child_paths"] = {c: str(target / Path(p).name)
                                    for c, p in group.get("child_paths", {}).items()}
            data = json.dumps(group).encode()
        (tmp / fname).write_bytes(data)
    try:
        os.replace(tmp, target)
    except OSError:
        for p in tmp.iterdir():  # another process installed it first: theirs is as good
            p.unlink()
        tmp.rmdir()
        if not target.is_dir():
            raise
