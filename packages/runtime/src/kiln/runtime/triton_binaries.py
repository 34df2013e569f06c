"""Compiled Triton kernels in artifacts: collected after the kernels ran, installed before a load.

Triton compiles a ``@jit`` kernel on its first launch and keeps the result in its cache directory,
one folder per compilation key (``<TRITON_CACHE_DIR>/<key>/``: the cubin, its JSON metadata, the
PTX/IR stages and a ``__grp__*.json`` listing them). The key covers the kernel source, the target
GPU, the options and triton's own version, so putting a folder back makes Triton load the binary
instead of compiling it — and a folder that does not fit is simply never looked up.

``collect_triton_binaries(program_source)`` finds the kernel modules the program's wrappers loaded
(each ``_TRITON_SOURCE`` text, nested sources included), and returns every compiled kernel's cache
folder as artifact files ``triton/<key>/<file>`` (kind ``triton_binary``), with the C launchers and driver helpers triton <= 3.6 builds for them with
the host compiler (a new machine would otherwise run gcc once per kernel signature at first launch). ``install_triton_binaries``
writes them into this process's Triton cache when the artifact was built for this GPU capability and
triton release (``checks.usable_files`` drops them otherwise, with a log line: Triton then rebuilds
from the sources the wrapper carries). We use only Triton's on-disk layout and public attributes of
compiled kernels, not its private loader APIs, which move between releases.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("kiln.runtime")

PREFIX = "triton/"
KERNEL_SOURCE_NAME = "_TRITON_SOURCE"  # the wrapper's constant holding the kernel module's text
MODULE_PREFIX = "kiln_triton_"  # the wrapper imports that text as kiln_triton_<sha256[:32]>


def kernel_sources(program_source: str) -> list[str]:
    """Every ``_TRITON_SOURCE = '...'`` text in the program, also inside embedded sources."""
    found: list[str] = []
    pending = [program_source]
    seen: set[str] = set()
    while pending:
        src = pending.pop()
        if src in seen:
            continue
        seen.add(src)
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str) \
                    and any(isinstance(t, ast.Name) and t.id == KERNEL_SOURCE_NAME for t in node.targets):
                found.append(node.value.value)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and KERNEL_SOURCE_NAME in node.value and "\n" in node.value:
                pending.append(node.value)  # a program embedded as text (the autograd wrapper's parts)
    return list(dict.fromkeys(found))


def _jit_functions(module: Any) -> Iterator[Any]:
    for value in vars(module).values():
        if isinstance(value, types.ModuleType):
            continue  # triton, tl, torch: not kernels (and their lazy attributes are not probed)
        fn = value
        while fn is not None and not hasattr(fn, "device_caches") and not hasattr(fn, "cache"):
            fn = getattr(fn, "fn", None)  # autotuner / heuristics wrappers
        if fn is not None and (hasattr(fn, "device_caches") or hasattr(fn, "cache")):
            yield fn


def _compiled_kernels(fn: Any) -> Iterator[Any]:
    caches = getattr(fn, "device_caches", None)
    if isinstance(caches, Mapping):
        for entry in caches.values():
            table = entry[0] if isinstance(entry, tuple) else entry
            if isinstance(table, Mapping):
                yield from table.values()
        return
    legacy = getattr(fn, "cache", None)  # triton < 3.2: {device: {key: CompiledKernel}}
    if isinstance(legacy, Mapping):
        for table in legacy.values():
            if isinstance(table, Mapping):
                yield from table.values()


def collect_triton_binaries(program_source: str, modules: Mapping[str, Any] | None = None
                            ) -> dict[str, bytes]:
    """The cache folders of the program's compiled kernels, as ``triton/<key>/<file>`` files."""
    modules = sys.modules if modules is None else modules
    files: dict[str, bytes] = {}
    for text in kernel_sources(program_source):
        module = modules.get(MODULE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32])
        if module is None:
            continue  # never loaded (or never launched) in this process: nothing compiled to ship
        for fn in _jit_functions(module):
            for kernel in _compiled_kernels(fn):
                files.update(_kernel_files(kernel))
                state = getattr(kernel, "__dict__", {})  # not ``kernel.run``: on an unlaunched kernel
                files.update(_host_module_files(state.get("_run") or state.get("run"), "launch"))  # it builds
    if files:
        files.update(_driver_utils_files())
    return files


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
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    return Path(os.environ.get("TRITON_HOME", os.path.expanduser("~"))) / ".triton" / "cache"


def install_triton_binaries(files: Mapping[str, bytes], where: str = "<artifact>",
                            cache_dir: Path | None = None) -> int:
    """Write the artifact's ``triton/`` folders into Triton's cache; returns how many kernels.

    Folders already there are kept (Triton wrote them, or an earlier load did). Group files list
    absolute paths, so they are rewritten to the folder they land in.
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
