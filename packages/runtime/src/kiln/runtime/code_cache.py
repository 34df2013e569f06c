"""The code cache: code objects of generated Python kept in the local compile cache (fast loads).

Loading an artifact runs the program's generated Python (wrapper and launchers). Like CPython's
``.pyc`` files, its code objects are kept, marshalled, in this machine's compile cache (never in
artifacts: an artifact holds only sources), keyed by the source text and the interpreter's bytecode
magic. Guard checks need no cache: they are built without ``compile()`` (``kiln.graph.guards_plan``).
"""

from __future__ import annotations

import _thread
import atexit
import hashlib
import importlib.util
import logging
import marshal
import os
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.graph import GuardSet

from .cache import CompileCache, default_cache

logger = logging.getLogger("kiln.runtime")

_MAGIC = importlib.util.MAGIC_NUMBER.hex() + sys.implementation.cache_tag
_CODE_NS = "pycode"


def compile_cached(source: str, filename: str, cache: CompileCache | None = None) -> types.CodeType:
    """``compile(source, filename, 'exec')``, reusing a marshalled code object from the cache.

    A new code object is written to the cache by a background thread (``flush_code_writes`` waits
    for it; so does interpreter exit): the write (marshal, checksum, mkdir, temp file, rename) would
    lengthen a new machine's load + first call, which needs the code but not its cache entry."""
    store = cache or default_cache()
    key = f"{_MAGIC}\0{filename}\0{hashlib.sha256(source.encode()).hexdigest()}"
    if not store.enabled:
        return compile(source, filename, "exec")
    pending = WRITER.queued(store, key)
    if pending is not None:  # compiled by this process moments ago, not yet written
        return pending[1]
    data = store.get(_CODE_NS, key)
    if data is not None:
        try:
            code = marshal.loads(data)
            if isinstance(code, types.CodeType):
                return code
        except (ValueError, EOFError, TypeError):
            pass
        logger.warning("compile cache: code entry for %s does not unmarshal; recompiling", filename)
    code = compile(source, filename, "exec")
    WRITER.write_later(store, key, code)
    return code


# ---- background writes of code objects --------------------------------------------------------------

class CodeWriter:
    """The queue of code objects to write to the cache, and the thread that writes them.

    A load queues its code objects; the writes start when its first call returned (``hold`` /
    ``release``), on a bare ``_thread`` thread that pauses ``delay_s`` first. One per process
    (``WRITER``); a forked child starts with an empty one (the queue is its parent's job)."""

    def __init__(self, delay_s: float = 0.25) -> None:
        self.delay_s = delay_s  # a writer's pause before it writes (see _start)
        self.lock = threading.Lock()
        self.pending: dict[tuple[int, str], tuple[CompileCache, types.CodeType]] = {}
        self.idle = threading.Event()
        self.idle.set()
        self.hurry = threading.Event()  # set: the writer writes now instead of after its delay
        self.running = False  # a writer thread runs
        self.exit_hook = False  # the exit flush is registered
        self.held = 0  # loads in progress: their writes wait for the first call (release)

    def hold(self) -> None:
        with self.lock:
            self.held += 1

    def release(self) -> None:
        with self.lock:
            self.held = max(0, self.held - 1)
            if not self.held:
                self._start()

    def queued(self, store: CompileCache, key: str) -> tuple[CompileCache, types.CodeType] | None:
        with self.lock:
            return self.pending.get((id(store), key))

    def write_later(self, store: CompileCache, key: str, code: types.CodeType) -> None:
        with self.lock:
            self.pending[(id(store), key)] = (store, code)
            self.idle.clear()
            if not self.exit_hook:  # exit writes what is queued (held or not), waiting at most 10 s
                self.exit_hook = True
                atexit.register(self.flush, 10.0)
            if not self.held:
                self._start()

    def _start(self) -> None:
        """With the lock held: a writer thread for the queue, unless one runs or nothing is queued.

        A bare ``_thread`` thread: ``threading.Thread.start`` waits until the new thread runs, and
        that thread must first win the GIL from the caller (a first call, in ``release``: 0.2-3 ms
        of a new machine's load + first call on a busy host). The writer then sleeps ``delay_s``
        before writing, so the marshal/write work does not compete with what the program does right
        after its first call; ``flush`` (and interpreter exit) cut the sleep short."""
        if not self.pending or self.running:
            return
        self.running = True  # the writer clears this under the lock as it ends
        try:
            # not waited for at exit (as a daemon thread): the exit hook flushes, with a timeout,
            # so a stuck filesystem cannot hang exit
            _thread.start_new_thread(self._drain, ())
        except RuntimeError:  # no new threads (3.12 at interpreter shutdown): write them here
            self.running = False
            for (_, key), (store, code) in list(self.pending.items()):
                _put(store, key, code)
            self.pending.clear()
            self.idle.set()

    def _drain(self) -> None:
        self.hurry.wait(self.delay_s)
        while True:
            with self.lock:
                if not self.pending:
                    self.running = False
                    self.hurry.clear()  # the next writer pauses again (unless a flush waits for it)
                    self.idle.set()
                    return
                item_key = next(iter(self.pending))
                store, code = self.pending[item_key]
            _put(store, item_key[1], code)
            with self.lock:
                self.pending.pop(item_key, None)

    def flush(self, timeout: float | None = None) -> bool:
        with self.lock:
            if self.pending:  # the writer that ends with an empty queue clears it
                self.hurry.set()
                self._start()
        return self.idle.wait(timeout)

    def after_fork_in_child(self) -> None:
        # the writer thread does not exist in a forked child: its copy of the queue is the parent's job
        self.lock, self.idle, self.hurry = threading.Lock(), threading.Event(), threading.Event()
        self.pending.clear()
        self.running = False
        self.held = 0
        self.idle.set()


WRITER = CodeWriter()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WRITER.after_fork_in_child)


def _put(store: CompileCache, key: str, code: types.CodeType) -> None:
    try:
        store.put(_CODE_NS, key, marshal.dumps(code))  # put logs its own OSErrors
    except Exception:  # noqa: BLE001 - a cache write must never break the program that loaded
        logger.warning("compile cache: writing a code object failed", exc_info=True)


def hold_code_writes() -> None:
    """Queue code-object writes without starting them (a load until its first call returns: the
    writer thread would take the GIL from the first call)."""
    WRITER.hold()


def release_code_writes() -> None:
    """End one ``hold_code_writes``; the last one starts the queued writes."""
    WRITER.release()


def flush_code_writes(timeout: float | None = None) -> bool:
    """Write the code objects compiled so far to the cache (also those a load still holds back) and
    wait for them; False if ``timeout`` ran out."""
    return WRITER.flush(timeout)


def cached_compile(source: Any, filename: str, mode: str, *args: Any, **kwargs: Any) -> Any:
    """The builtin ``compile`` for a program's own namespace: programs that embed sources (the
    autograd wrapper executes its forward and backward parts) reuse cached code objects too."""
    if mode == "exec" and isinstance(source, str) and not args and not kwargs:
        return compile_cached(source, filename)
    return compile(source, filename, mode, *args, **kwargs)


# ---- guard checks ----------------------------------------------------------------------------------

def compile_guards(guards: GuardSet, outputs: Sequence[str] | None = None,
                   tree: Sequence[tuple[str, int, str]] = (), layout: Mapping[str, Any] | None = None,
                   records: Sequence[Any] | None = None) -> Any:
    """The guard check of ``guards``; with ``outputs`` it also gathers their values (a list, or
    None when a guard fails). Built as a plan of C-level reads (``kiln.graph.guards_plan``), with no
    ``compile()``, so there is nothing to cache: ~2 ms for 1,400 guards on a new machine.
    ``tree``: the artifact's read tree of the sources (schema 3), so the plan does not split them;
    ``layout``: the plan itself as saved with the artifact for these guards and outputs (schema 3),
    so the load only builds it (~4x less work); one that does not fit is logged and rebuilt.
    ``records``: the guards the layout indexes (a schema-3 manifest's records), when not ``guards``."""
    if outputs is None:
        return guards.compile()
    if layout is not None:
        try:
            # a schema-3 manifest's guards are records until something needs Guards
            check = guards.compile_layout(layout, records if records is not None
                                          else getattr(guards.guards, "records", None))
            if layout.get("outputs") is not None and len(layout["outputs"]) == len(outputs):
                return check
            logger.warning("artifact guard plan gathers %s values, the call needs %d; rebuilding it",
                           len(layout.get("outputs") or ()), len(outputs))
        except (ValueError, IndexError, KeyError, TypeError) as e:
            logger.warning("artifact guard plan does not fit its guards (%s: %s); rebuilding it",
                           type(e).__name__, e)
    return guards.compile_gather(outputs, tree) if tree else guards.compile_gather(outputs)
