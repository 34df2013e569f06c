"""The Triton (CUDA) backend: not written yet.

It will implement ``codegen.common.KernelBackend`` over the same inputs the C++ backend consumes:
``ScheduledProgram.kernels()`` (``ir.Kernel``: outer/inner ranges, staged ``KernelNode`` bodies with
roles, store flags and sympy indices over ``x*``/``r*``/``d*``) and the buffer layouts. Until then
``pipeline.backend_for`` raises ``BackendUnavailable`` for CUDA inputs.
"""
