"""What kiln knows about triton's kernel objects, kept beside them as declared data, never set on them.

Two facts cross between a generated wrapper's launcher (kiln.inductor's codegen/triton/launcher.py,
which runs wherever the wrapper runs) and kiln.runtime's save and load of compiled kernels
(triton_binaries.py, triton_preload.py, triton_compile.py):

- ``LaunchRecord``: the launch that compiled a kernel -- its constexprs, warps, stages, triton's
  option knobs and, per argument, what triton specialises on. The launcher notes it when triton hands
  back a binary; a save writes it into the kernel's record; a load notes it again for the kernel it
  files into triton's cache, and a launcher whose first call is described exactly so binds that
  binary directly (no ``JITFunction.run``).
- the JIT functions whose binaries a load handed to triton: a wrapper's precompile leaves them alone.

``KERNEL_NOTES`` holds them, keyed weakly by triton's objects (a note dies with its kernel): triton's
classes are not kiln's to extend, and the two sides then agree on one declared form instead of on a
private attribute name.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """One launch as triton keys it, as canonical JSON text (``describe`` in launcher.py makes the data)."""

    text: str

    @staticmethod
    def of(description: Any) -> LaunchRecord | None:
        """The record of a launch description (JSON data: lists and scalars); None when it is not that."""
        if not isinstance(description, list):
            return None
        try:
            return LaunchRecord(json.dumps(description, separators=(",", ":"), allow_nan=False))
        except (TypeError, ValueError):
            return None

    def as_data(self) -> list[Any]:
        data = json.loads(self.text)
        assert isinstance(data, list)
        return data


class KernelNotes:
    """Launch records of compiled kernels and the set of preloaded JIT functions (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches: weakref.WeakKeyDictionary[Any, LaunchRecord] = weakref.WeakKeyDictionary()
        self._preloaded: weakref.WeakSet[Any] = weakref.WeakSet()

    def launch(self, kernel: Any) -> LaunchRecord | None:
        """The launch ``kernel`` was compiled by (or was filed for at load); None when not known."""
        try:
            return self._launches.get(kernel)
        except TypeError:  # an object that cannot be weakly referenced: nothing was noted
            return None

    def note_launch(self, kernel: Any, record: LaunchRecord | None) -> None:
        """Note the launch that made ``kernel``; the first note stays (a kernel is compiled once)."""
        if record is None:
            return
        with self._lock:
            try:
                self._launches.setdefault(kernel, record)
            except TypeError:  # not weakly referenceable: the kernel is simply never bound directly
                pass

    def mark_preloaded(self, fn: Any) -> None:
        with self._lock:
            try:
                self._preloaded.add(fn)
            except TypeError:
                pass

    def preloaded(self, fn: Any) -> bool:
        """Whether a load handed binaries of the JIT function ``fn`` to triton in this process."""
        try:
            return fn in self._preloaded
        except TypeError:
            return False


KERNEL_NOTES = KernelNotes()  # triton's kernel objects live per process: so do kiln's notes about them
