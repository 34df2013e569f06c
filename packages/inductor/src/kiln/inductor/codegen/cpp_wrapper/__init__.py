"""The C++ wrapper: a schedule as C++ source over libtorch (no Python), for kiln.package.

``cpp_wrapper_source(scheduled, symbols, slots)`` writes it (writer.py): the memory plan's
allocations, kernels called by symbol (CPU) or launched as cubins through the CUDA driver API
(``CudaKernels``), externs as typed or boxed ATen calls (aten_calls.py), over the ABI in prelude.py.
``kiln.inductor.cpp_program`` runs the pipeline and calls it.
"""

from .aten_calls import CppWrapperUnsupported
from .prelude import ABI_VERSION
from .writer import CppWrapperWriter, CudaKernels, SizeArgs, Slot, cpp_wrapper_source, output_specs

__all__ = ["ABI_VERSION", "CppWrapperUnsupported", "CppWrapperWriter", "CudaKernels", "SizeArgs", "Slot",
           "cpp_wrapper_source", "output_specs"]
