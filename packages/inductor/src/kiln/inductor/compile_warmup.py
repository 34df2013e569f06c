"""The kernel a Triton compile worker compiles as soon as it starts (``compile_worker.py --warm=...``).

A worker's first compile costs about half a second more than the next ones: triton hashes its own
sources and library for its cache key, imports its code generator and runs ptxas for the first time.
Paid on the first job, that lands on the critical path of the first graph's compile (every worker's
first job, all at once). Paid at start-up, it overlaps the parent's capture and lowering. Loaded by
path in the worker only (it imports triton): kiln.inductor never imports it.
"""

import triton
import triton.language as tl


@triton.jit
def warm(ptr_x, XBLOCK: tl.constexpr):  # noqa: ANN001, ANN201 - a Triton kernel
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    x = tl.load(ptr_x + i)
    tl.store(ptr_x + i, tl.exp(x) * 2.0)
