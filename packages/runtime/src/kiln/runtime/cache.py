"""The on-disk compile cache: content-addressed, per user (0700), atomic, verified on every read.

Layout under the root (``KILN_CACHE_DIR``, default ``~/.cache/kiln``)::

    v1/entries/<namespace>/<h[:2]>/<h>   h = sha256(key); a header line + the data
    v1/files/<namespace>/<sha256><suffix>  plain files that must exist on disk (dlopen, import)
    v1/locks/<h>.lock                    advisory locks so concurrent builders do not duplicate work

An entry's header records its namespace, key, size and sha256. A read checks all of them: a
truncated, corrupt or foreign entry (another key's data, another user's file) is logged, deleted
and reported as a miss, so it is rebuilt — never trusted, never a crash. Writes go to a temporary
file in the same directory and are published with ``os.replace``, so readers see a whole entry or
none, whichever process wins a race.

Another process may clear the cache (``kiln cache clear``, a test's fixture) at any moment, also
between a build and its use: builders keep the bytes they built (never re-read them from the cache),
writes recreate the folders a clear removed, and ``with_file`` / ``with_tree`` write a file again
when it vanished before its user opened it. An entry that vanished is rebuilt, never an error.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .environment import current_host, environment_record
from .knobs import KNOBS

logger = logging.getLogger("kiln.runtime.cache")

LAYOUT = "v1"
MAGIC = b"KILNCACHE1\n"
_NAMESPACE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_MAX_HEADER = 4096
_ATTEMPTS = 3  # writes and uses of a file that a concurrent clear removed meanwhile are tried again
T = TypeVar("T")

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, builds may be duplicated
    fcntl = None  # type: ignore[assignment]


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def cache_key(*parts: str | bytes) -> str:
    """A content key over ``parts`` (graph text, options...) and everything else that changes
    generated code: kiln, torch, triton and Python versions and the host CPU. Use it for entries
    whose bytes depend on the environment (generated code, kernels, autotuning results)."""
    host = current_host()
    h = hashlib.sha256()
    env = (json.dumps(environment_record(), sort_keys=True), host.machine,
           " ".join(sorted(host.cpu_flags)))
    for part in (*env, *parts):
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    enabled: bool
    entries: int = 0
    bytes: int = 0
    namespaces: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (entries, bytes)

    def as_text(self) -> str:
        if not self.enabled:
            return f"kiln compile cache at {self.root}: disabled"
        lines = [f"kiln compile cache at {self.root}",
                 f"  {self.entries} entries, {_human(self.bytes)}"]
        for ns, (n, b) in sorted(self.namespaces.items()):
            lines.append(f"  {ns:<20} {n:>6} entries  {_human(b):>10}")
        return "\n".join(lines)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class CompileCache:
    """A content-addressed byte store on disk. ``root=None`` uses ``KILN_CACHE_DIR``."""

    def __init__(self, root: str | os.PathLike | None = None, *, enabled: bool | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else KNOBS.cache_dir
        self._enabled = KNOBS.cache_enabled if enabled is None else enabled
        self._ready: bool | None = None
        self._scratch: Path | None = None
        self._made: set[Path] = set()

    # ---- setup -----------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        if self._ready is None:
            self._ready = self._enabled and self._prepare_root()
        return self._ready

    def _prepare_root(self) -> bool:
        try:
            st = _makedirs(self.root)
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                logger.warning("compile cache %s belongs to another user (uid %d); not using it. "
                               "Set KILN_CACHE_DIR to a directory of your own.", self.root, st.st_uid)
                return False
            if st.st_mode & 0o077:
                os.chmod(self.root, 0o700)  # the cache holds code we will execute: keep it private
            return True
        except OSError as e:
            logger.warning("compile cache %s is not usable (%s); compiling without a cache. Set "
                           "KILN_CACHE_DIR to a writable directory.", self.root, e)
            return False

    def _dir(self, *parts: str) -> Path:
        d = self.root.joinpath(LAYOUT, *parts)
        if d not in self._made:  # once per process: a load touches a few folders many times
            _makedirs(d)
            self._made.add(d)
        return d

    def _entry_path(self, namespace: str, key: str) -> Path:
        if not _NAMESPACE.match(namespace):
            raise ValueError(f"invalid cache namespace {namespace!r}: use lowercase letters, digits, "
                             "'_', '-', '.'")
        h = key_hash(key)
        return self.root / LAYOUT / "entries" / namespace / h[:2] / h

    # ---- bytes API -------------------------------------------------------------------------------
    def get(self, namespace: str, key: str) -> bytes | None:
        """The data stored under (namespace, key), or None if absent or not valid."""
        path = self._entry_path(namespace, key)
        if not self.enabled:
            return None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.warning("compile cache: cannot read %s (%s); rebuilding", path, e)
            return None
        data, problem = _decode(raw, namespace, key)
        if problem is None and hasattr(os, "getuid"):
            with contextlib.suppress(OSError):
                if path.stat().st_uid != os.getuid():
                    problem = "the file belongs to another user"
        if problem is not None:
            logger.warning("compile cache: ignoring %s entry %s (%s); it will be rebuilt",
                           namespace, path, problem)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return data

    def put(self, namespace: str, key: str, data: bytes) -> bool:
        """Store ``data``; False (logged) when the cache is disabled or the write failed."""
        path = self._entry_path(namespace, key)
        if not self.enabled:
            return False
        header = json.dumps({"ns": namespace, "key": key, "size": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()}).encode()
        try:
            self._dir("entries", namespace, path.parent.name)
            _atomic_write(path, MAGIC + header + b"\n" + data)
            return True
        except OSError as e:
            logger.warning("compile cache: cannot write %s (%s); continuing without caching it",
                           path, e)
            return False

    def get_or_build(self, namespace: str, key: str, build: Callable[[], bytes]) -> bytes:
        """The cached data, or ``build()``'s result stored for next time.

        Concurrent callers of the same key in other processes wait on an advisory lock rather than
        building twice; the entry they then read is verified like any other.
        """
        data = self.get(namespace, key)
        if data is not None:
            return data
        with self._lock(key):
            data = self.get(namespace, key)
            if data is None:
                data = build()
                if not isinstance(data, (bytes, bytearray)):
                    raise TypeError(f"cache builder for {namespace} returned {type(data).__name__}, "
                                    "not bytes")
                data = bytes(data)
                self.put(namespace, key, data)
        return data

    def get_json(self, namespace: str, key: str) -> object | None:
        data = self.get(namespace, key)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            logger.warning("compile cache: %s entry for %r is not JSON; ignoring it", namespace, key)
            return None

    def put_json(self, namespace: str, key: str, value: object) -> bool:
        return self.put(namespace, key, json.dumps(value, sort_keys=True).encode())

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """An advisory inter-process lock on ``key`` (a no-op when the cache is disabled): processes
        sharing the cache build each entry once, the others wait and then read it."""
        return self._lock(key)

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        if not self.enabled or fcntl is None:
            yield
            return
        name = f"{key_hash(key)}.lock"
        try:
            try:
                fd = os.open(self._dir("locks") / name, os.O_CREAT | os.O_RDWR, 0o600)
            except FileNotFoundError:  # another process cleared the cache: make the folder again
                self._made.discard(self.root / LAYOUT / "locks")
                fd = os.open(self._dir("locks") / name, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    # ---- files that must exist on disk -----------------------------------------------------------
    def materialize(self, namespace: str, data: bytes, suffix: str = "") -> Path:
        """A file holding ``data``, named by its sha256; reused (after verifying) when present."""
        digest = hashlib.sha256(data).hexdigest()
        folder = self._dir("files", namespace) if self.enabled else self._scratch_dir(namespace)
        path = folder / f"{digest}{suffix}"
        try:
            if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:
                return path
        except OSError:
            pass
        _atomic_write(path, data)
        return path

    def materialize_tree(self, namespace: str, key: str, files: Mapping[str, bytes]) -> Path:
        """A directory holding ``files`` (name -> bytes), content-addressed by ``key``."""
        folder = (self._dir("files", namespace) if self.enabled else self._scratch_dir(namespace))
        target = folder / key_hash(key)[:32]
        if target.is_dir() and _tree_matches(target, files):
            return target
        for attempt in range(_ATTEMPTS):
            try:
                return _publish_tree(folder, target, files)
            except FileNotFoundError as e:  # a concurrent clear removed the folder while we wrote it
                if attempt == _ATTEMPTS - 1:
                    raise
                logger.info("compile cache: %s vanished while it was written (%s); writing it again", target, e)
        raise AssertionError("unreachable")

    def with_file(self, namespace: str, data: bytes, suffix: str, use: Callable[[Path], T]) -> T:
        """``use(path)`` of ``materialize(namespace, data, suffix)``: when ``use`` fails (OSError, or
        any error) because the file is gone (another process cleared the cache between the write and
        ``use``), the file is written again and ``use`` retried; other failures are ``use``'s own. A
        write that the clears defeat every time falls back to a private temporary folder (kept: a
        library loaded from it stays mapped)."""
        try:
            return self._retry_vanished(lambda: self.materialize(namespace, data, suffix),
                                        lambda p: p.is_file(), use)
        except FileNotFoundError as e:
            # the cache was cleared under every attempt (a loop clearing it, or a loaded machine): the
            # file is used from a private folder of its own instead, which no clear of the cache touches
            logger.warning("compile cache: cleared while %s was written, %d times; using it from a private "
                           "temporary folder (%s)", namespace, _ATTEMPTS, e)
            folder = Path(tempfile.mkdtemp(prefix="kiln-uncached-"))
            path = folder / f"{hashlib.sha256(data).hexdigest()}{suffix}"
            _write_and_rename(path, data)
            return use(path)

    def with_tree(self, namespace: str, key: str, files: Mapping[str, bytes], use: Callable[[Path], T]) -> T:
        """``use(folder)`` of ``materialize_tree(namespace, key, files)``, written again and retried
        when the folder was removed (or emptied) before ``use`` had opened what it needs."""
        return self._retry_vanished(lambda: self.materialize_tree(namespace, key, files),
                                    lambda p: _tree_matches(p, files), use)

    def _retry_vanished(self, make: Callable[[], Path], whole: Callable[[Path], bool],
                        use: Callable[[Path], T]) -> T:
        for attempt in range(_ATTEMPTS):
            try:
                path = make()
            except FileNotFoundError as e:  # its folder was removed between the write and the rename
                if attempt == _ATTEMPTS - 1:
                    raise
                logger.warning("compile cache: a folder vanished while writing (another process cleared the "
                               "cache?): %s; writing it again", e)
                continue
            try:
                return use(path)
            except Exception as e:
                if whole(path):
                    raise
                if attempt == _ATTEMPTS - 1:
                    raise FileNotFoundError(f"{path} vanished before it was used, {_ATTEMPTS} times") from e
                logger.warning("compile cache: %s vanished before it was used (another process cleared "
                               "the cache?): %s; writing it again", path, e)
        raise AssertionError("unreachable")

    def _scratch_dir(self, namespace: str) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="kiln-"))
            atexit.register(shutil.rmtree, self._scratch, True)
        d = self._scratch / namespace
        d.mkdir(exist_ok=True)
        return d

    # ---- maintenance (the CLI's `kiln cache info` / `kiln cache clear`) ----------------------------
    def info(self) -> CacheInfo:
        if not self.enabled:
            return CacheInfo(self.root, False)
        per_ns: dict[str, tuple[int, int]] = {}
        base = self.root / LAYOUT
        for area in ("entries", "files"):
            area_dir = base / area
            if not area_dir.is_dir():
                continue
            for ns_dir in area_dir.iterdir():
                n, b = per_ns.get(ns_dir.name, (0, 0))
                for p in ns_dir.rglob("*"):
                    if p.is_file() and not p.name.startswith(".tmp-"):
                        n, b = n + 1, b + p.stat().st_size
                per_ns[ns_dir.name] = (n, b)
        return CacheInfo(self.root, True, sum(n for n, _ in per_ns.values()),
                         sum(b for _, b in per_ns.values()), per_ns)

    def clear(self, namespace: str | None = None) -> int:
        """Delete all entries (or one namespace's); returns how many files were removed."""
        if not self.enabled:
            return 0
        self._made.clear()
        removed = 0
        base = self.root / LAYOUT
        for area in ("entries", "files"):
            targets = [base / area / namespace] if namespace else [base / area]
            for t in targets:
                if t.exists():
                    removed += sum(1 for p in t.rglob("*") if p.is_file())
                    shutil.rmtree(t, ignore_errors=True)
        if namespace is None:
            shutil.rmtree(base / "locks", ignore_errors=True)
        return removed


def _decode(raw: bytes, namespace: str, key: str) -> tuple[bytes, str | None]:
    if not raw.startswith(MAGIC):
        return b"", "not a kiln cache entry (bad magic)"
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        return b"", "truncated header"
    try:
        header = json.loads(raw[len(MAGIC):end])
    except ValueError:
        return b"", "corrupt header"
    if not isinstance(header, dict) or header.get("ns") != namespace or header.get("key") != key:
        return b"", "foreign entry: it was stored for another key"
    data = raw[end + 1:]
    if len(data) != header.get("size"):
        return b"", f"truncated: {len(data)} of {header.get('size')} bytes"
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        return b"", "checksum mismatch"
    return data, None


def _publish_tree(folder: Path, target: Path, files: Mapping[str, bytes]) -> Path:
    tmp = _new_temp_dir(folder)
    made = {tmp}
    for name, data in files.items():
        path = tmp / name
        if path.parent not in made:
            _makedirs(path.parent)
            made.add(path.parent)
        path.write_bytes(data)
    if target.exists():
        logger.warning("compile cache: %s does not match its key; replacing it", target)
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except FileNotFoundError:  # tmp itself was removed by a concurrent clear: the caller writes it again
        raise
    except OSError:  # another process published it first: use theirs if it is whole
        shutil.rmtree(tmp, ignore_errors=True)
        if not _tree_matches(target, files):
            raise
    return target


def _tree_matches(target: Path, files: Mapping[str, bytes]) -> bool:
    try:
        return all(hashlib.sha256((target / n).read_bytes()).digest() == hashlib.sha256(d).digest()
                   for n, d in files.items())
    except OSError:
        return False


def _makedirs(d: Path) -> os.stat_result:
    """``d`` and its missing parents (0700), top-down, and its stat. A new machine's load creates
    the cache's folders: ``Path.mkdir(parents=True)`` tries the deepest first and climbs up through
    FileNotFoundErrors (and an existing folder costs a FileExistsError), slower on a new machine's load."""
    try:
        return _a_folder(d, os.stat(d))
    except FileNotFoundError:
        pass
    missing = [d]
    while not os.path.isdir(missing[-1].parent) and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # another process made it meanwhile
            pass
    return _a_folder(d, os.stat(d))


def _a_folder(d: Path, st: os.stat_result) -> os.stat_result:
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{d} is not a folder")
    return st


_TEMP_SEQ = itertools.count()


def _new_temp_dir(folder: Path) -> Path:
    """A new private folder in ``folder``, named by process, thread and a counter (``mkdtemp``'s
    first use seeds a random generator: ~0.1-0.3 ms of a new process's load); mkdtemp if taken."""
    tmp = folder / f".tmp-{os.getpid()}-{threading.get_ident()}-{next(_TEMP_SEQ)}"
    try:
        try:
            os.mkdir(tmp, 0o700)
        except FileNotFoundError:  # another process cleared the cache: make the folder again
            _makedirs(folder)
            os.mkdir(tmp, 0o700)
        return tmp
    except FileExistsError:  # a leftover of a crashed process with the same pid
        return Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder))


def _atomic_write(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all. A folder removed meanwhile (another process cleared
    the cache between the mkdir and the rename) is made again and the write repeated."""
    for attempt in range(_ATTEMPTS):
        try:
            _write_and_rename(path, data)
            return
        except FileNotFoundError:
            if attempt == _ATTEMPTS - 1:
                raise


def _write_and_rename(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mkstemp files are 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _DefaultCache:
    """Owns the process's default cache: made on first use, replaceable for a block (``using_cache``)."""

    def __init__(self) -> None:
        self.cache: CompileCache | None = None

    def get(self) -> CompileCache:
        if self.cache is None:
            self.cache = CompileCache()
        return self.cache


_DEFAULT = _DefaultCache()


def default_cache() -> CompileCache:
    """The process's cache at ``KILN_CACHE_DIR`` (created on first use)."""
    return _DEFAULT.get()


@contextlib.contextmanager
def using_cache(cache: CompileCache) -> Iterator[CompileCache]:
    """``cache`` is the process's default cache for the block (tests, tools that compile into a
    cache of their own)."""
    before, _DEFAULT.cache = _DEFAULT.cache, cache
    try:
        yield cache
    finally:
        _DEFAULT.cache = before
