"""A model library's outputs taken into Python: the one implementation for both in-process callers (a
package's ``PackagedModel``, kiln.compile's ``GraphLibrary``).

``kiln_model_run`` (ABI 4, kiln.inductor's codegen/cpp_wrapper/prelude.py) allocates every output itself,
when its program computes it, and hands each over as an owned reference to its ``at::TensorImpl``. Python
wraps each with ``torch._C._wrap_tensor_impl`` (given the pointer in a capsule; it takes a reference of its
own: the same tensor, not a copy) and gives the library's references back with
``kiln_model_release_outputs``.

Note: why this handover. The library links libtorch alone, never libpython (a C++ program with no Python
loads the same model.so: ``kiln/runner.h`` adopts the references with ``intrusive_ptr::reclaim``), so the
Python object is made on this side. A capsule and a wrapped TensorImpl cost about 1.5 us per output on
this project's CPU host, a third of the ``torch.empty_strided`` per output the caller made before; a DLPack
handover (``at::toDLPack``, a capsule, ``torch.utils.dlpack.from_dlpack``) about 10 us.
"""

from __future__ import annotations

import array
import ctypes

import torch

from ..errors import GuardError

# how the library's check_sizes says a relation between the sizes is broken (kiln.inductor's writer.py)
SIZE_RELATION_BROKEN = "the input sizes break a relation"
_REPORTED = "kiln model: "  # kiln_rt::report's prefix
_wrap = torch._C._wrap_tensor_impl  # type: ignore[attr-defined]  # a capsule holding a TensorImpl* -> its tensor
_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


class OutputHandover:
    """The ``outputs`` slots of one library's calls, and the tensors in them after a call."""

    __slots__ = ("n", "_empty", "_release")

    def __init__(self, lib: ctypes.CDLL, n: int) -> None:
        self.n = n
        self._empty = array.array("Q", bytes(8 * max(n, 1)))
        self._release = lib.kiln_model_release_outputs
        self._release.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._release.restype = None

    def slots(self) -> array.array:
        """Fresh null slots for one call (per call: calls may overlap in threads); pass ``buffer_info()[0]``."""
        return self._empty[:]

    def take(self, slots: array.array) -> list[torch.Tensor | None]:
        """Each slot's tensor (None where the library handed over nothing); the library's references dropped."""
        try:
            return [_wrap(_capsule(p, None, None)) if p else None for p in slots[:self.n]]
        finally:
            self._release(slots.buffer_info()[0], self.n)


def run_error(message: str, who: str) -> Exception:
    """The exception for a failed ``kiln_model_run``: a GuardError when the sizes break a relation the
    program assumed (as a Python wrapper's size guards say it), else a RuntimeError."""
    said = message.removeprefix(_REPORTED)
    if said.startswith(SIZE_RELATION_BROKEN):
        return GuardError(f"{who}: {said}")
    return RuntimeError(f"{who}: {said}")
