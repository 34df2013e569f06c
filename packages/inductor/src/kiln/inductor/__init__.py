"""kiln.inductor: loop-level IR, fusion and scheduling, C++/OpenMP code generation, Python wrapper.

Entry point: ``compile_graph(gm, example_inputs, options=InductorOptions()) -> CompiledGraph``.
"""

from .codegen.common import CompiledKernels, KernelBackend
from .codegen.cpp import CppBackend, CppCompileError
from .codegen.triton.ahead import warm_compile_pool
from .compile import compile_graph
from .decomp_bridge import inductor_decompositions
from .frontend import inductor_backend, to_aten
from .ir import (
    DynamicShapeUnsupported,
    Kernel,
    KernelNode,
    LoopProgram,
    ScheduledProgram,
    SizeGuard,
    SizeSource,
)
from .lowering.lower import LoweringError
from .lowering.registry import LOWERINGS, lowered_ops
from .options import InductorOptions, MisalignedMatmuls
from .scheduler import PlannedPeak, planned_peak
from .size_guards import guard_text
from .tiered import build_tiered_now, wait_tiered

__all__ = [
    "LOWERINGS", "CompiledKernels", "DynamicShapeUnsupported", "SizeGuard", "SizeSource", "CppBackend", "CppCompileError", "InductorOptions", "Kernel", "KernelBackend",
    "KernelNode", "LoopProgram", "LoweringError", "MisalignedMatmuls", "PlannedPeak", "ScheduledProgram", "compile_graph", "guard_text", "inductor_backend",
    "inductor_decompositions", "lowered_ops", "planned_peak", "to_aten", "wait_tiered", "build_tiered_now", "warm_compile_pool",
]
