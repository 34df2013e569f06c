"""Programmatic dependent launch (PDL) for the generated Triton kernels.

A CUDA stream (or a CUDA graph's chain of kernel nodes) starts a kernel only when the one before it has
finished: between two dependent kernels the GPU drains, then launches and ramps up the next. A decode
step is 86 such kernels of a few microseconds each, and the gaps cost about a microsecond apiece. On
sm_90+ a kernel launched with the programmatic-stream-serialization attribute may start once every
program of the kernel before it has executed ``griddepcontrol.launch_dependents`` (or exited); its own
``griddepcontrol.wait`` then blocks until that kernel has completed and its writes are visible.

Each kernel here starts with both: it lets the next kernel launch as soon as all its own programs are
running, and waits for the previous kernel before it reads or writes anything. So no load or store
moves across a kernel boundary -- a kernel that reads what the previous one wrote, or overwrites a
buffer the previous one still reads (the memory planner reuses buffers), sees the same order as
without PDL -- and what overlaps is only the next kernel's launch and start-up. Without the launch
attribute (triton's own launch path, which a kernel's first launch takes) both instructions do nothing.
A kernel that prefetches its weights into L2 (prefetch.py, ``pdl_prefetch``) issues the prefetches first,
then waits, and only then lets the next kernel launch.

The Python wrapper's launcher (launcher.py) sets the attribute on the kernels it launches directly, and
the C++ wrapper's (kiln/model_support_cuda.h, ``KernelInfo::pdl``) on the cubins compiled from them.
A kernel launched with it after a library call (cuBLAS, attention) or a copy just waits for it;
library work launched after one of these kernels is ordered by the stream as usual. Cubins for a GPU
older than sm_90 are compiled from the kernels without the two instructions (``without_pdl``).
"""

from __future__ import annotations

import dataclasses

from ...knobs import triton_interpret
from .ahead import compile_target
from .kernel import TritonKernel, ptr_name
from .prefetch import prefetch_lines

_LAUNCH = "    tl.extra.cuda.gdc_launch_dependents()  # the next kernel may launch (pdl.py)\n"
_WAIT = "    tl.extra.cuda.gdc_wait()  # the previous kernel has finished: its writes are visible\n"
PROLOGUE = _LAUNCH + _WAIT
# a kernel prefetching its weights (prefetch.py) lets the next one launch only once it has waited itself:
# one kernel ahead prefetches while another runs, not every kernel that fits beside it
AFTER_PREFETCH = _WAIT + _LAUNCH


def prologue(k: TritonKernel) -> str:
    """The lines ``with_pdl`` puts first in ``k``'s kernel function."""
    lines = prefetch_lines(k.streams, {b: ptr_name(b) for b in k.pointer_args}, k.xblock)
    if not lines:
        return PROLOGUE
    return "".join(f"    {line}\n" for line in lines) + AFTER_PREFETCH


def pdl_supported(device: str) -> bool:
    """Whether kernels compiled for ``device`` take PDL: this process's GPU (or, without one, the
    cross-compile target ``KILN_TRITON_CROSS_TARGET``) is sm_90 or newer -- ptxas refuses
    ``griddepcontrol`` for older targets, so without a known target kernels are written without it.
    Never on the CPU or under the interpreter."""
    if device != "cuda" or triton_interpret():
        return False
    target, _ = compile_target(device)
    return target is not None and target[1] >= 90


def with_pdl(k: TritonKernel) -> TritonKernel:
    """``k`` whose kernel function waits for the previous kernel first and lets the next one launch
    (helpers a kernel group's function calls are left as they are); a kernel launching another's
    identical function (``function``) has no source of its own and is only marked."""
    if k.pdl:
        return k
    if k.function:
        return dataclasses.replace(k, pdl=True)
    head = f"def {k.name}("
    lines = k.source.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith(head)), None)
    if at is None:
        raise ValueError(f"triton kernel {k.name}: no line starting {head!r} in its source")
    end = next(i for i in range(at, len(lines)) if lines[i].rstrip().endswith(":"))  # a signature may wrap
    source = "\n".join([*lines[:end + 1], prologue(k).rstrip("\n"), *lines[end + 1:]])
    return dataclasses.replace(k, source=source, pdl=True)


def without_pdl(k: TritonKernel) -> TritonKernel:
    """``k`` as it was before ``with_pdl`` (for a GPU without grid dependency control)."""
    if not k.pdl:
        return k
    return dataclasses.replace(k, source=k.source.replace(prologue(k), "", 1), pdl=False)
