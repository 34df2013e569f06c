"""kiln's Triton backend: scheduled ``Kernel``s -> ``@triton.jit`` sources plus launch descriptions.

Public API:
- ``generate_kernel(kernel, cfg) -> TritonKernel`` (source, pointer/size argument order, grid, blocks)
- ``module_source(kernels)``, ``wrapper_prologue(kernels)``, ``launch_statement(kernel)``: text for the
  Python wrapper; ``load_triton_module(source)`` imports kernel text at run time.
- ``TritonKernels(kernels)``: generate + load + launch in-process (tests, direct use).
"""

from .heuristics import BlockChoice, TritonConfig
from .kernel import TritonKernel, generate_kernel, generate_kernels
from .ops import EMITTERS
from .wrapper import (
                      MODULE_VAR,
                      TritonKernels,
                      launch_statement,
                      load_triton_module,
                      module_source,
                      wrapper_prologue,
)

__all__ = [
    "EMITTERS", "MODULE_VAR", "BlockChoice", "TritonConfig", "TritonKernel", "TritonKernels",
    "generate_kernel", "generate_kernels", "launch_statement", "load_triton_module", "module_source", "wrapper_prologue",
]
