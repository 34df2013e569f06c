"""kiln's loop-level IR: expression bodies, buffers and loop nodes, programs, kernels, verifiers."""

from .collectives import COLLECTIVES, WAIT_TENSOR, WRAP_TENSOR, issues_collective
from .expr import (
                   OPS,
                   Cast,
                   Constant,
                   Expr,
                   IndexValue,
                   Load,
                   Op,
                   OpInfo,
                   cast,
                   children,
                   format_expr,
                   map_expr,
                   op,
                   reads,
                   size,
                   substitute_index,
                   walk,
)
from .index import (
                   DerivedSize,
                   DynamicShapeUnsupported,
                   FloorDiv,
                   IndexExpr,
                   ModIndex,
                   as_index,
                   contiguous_strides,
                   fold_divmod,
                   index_var,
                   index_vars,
                   is_dense,
                   is_static,
                   is_symbolic,
                   product,
                   size_symbol,
                   strided_index,
                   sym_expr,
)
from .kernel import (
                   Allocation,
                   Kernel,
                   KernelGroup,
                   KernelNode,
                   ScheduledProgram,
                   Step,
                   kernel_size_symbols,
                   work_buffers,
)
from .nodes import (
                   REDUCTION_TYPES,
                   Arg,
                   ComputedBuffer,
                   ConstArg,
                   ExternKernel,
                   ExternOutput,
                   InputBuffer,
                   Layout,
                   ListArg,
                   LoopData,
                   Node,
                   Pointwise,
                   Reduction,
                   Scan,
                   Scatter,
                   TensorRef,
                   args_buffers,
                   loop_bodies,
                   node_outputs,
)
from .parse import IRParseError, parse_index, parse_layout, parse_program
from .program import LoopProgram, Output, node_reads
from .scalars import SymScalar, python_scalar, sym_scalar
from .sizes import (
                   SizeGuard,
                   SizeSource,
                   float_symbol,
                   is_float_symbol,
                   is_size_symbol,
                   size_param_ctype,
                   size_symbols_of,
                   substitute_hints,
)
from .verify import verify_kernel, verify_program, verify_schedule

__all__ = [
    "IRParseError", "parse_index", "parse_layout", "parse_program",
    "OPS", "REDUCTION_TYPES", "Allocation", "Arg", "Cast", "ComputedBuffer", "ConstArg", "Constant", "Expr",
    "ExternKernel", "ExternOutput", "FloorDiv", "IndexExpr", "IndexValue", "InputBuffer", "Kernel", "KernelGroup",
    "KernelNode", "Layout", "ListArg", "Load", "LoopData", "LoopProgram", "ModIndex", "Node", "Op", "OpInfo",
    "Output", "Pointwise", "Reduction", "Scan", "Scatter", "loop_bodies", "ScheduledProgram", "Step", "TensorRef", "args_buffers",
    "as_index", "cast", "children", "contiguous_strides", "fold_divmod", "is_dense", "format_expr", "index_var",
    "index_vars",
    "is_static", "map_expr", "node_outputs", "node_reads", "op", "product", "reads", "size",
    "strided_index", "substitute_index", "verify_kernel", "verify_program", "verify_schedule", "walk",
    "work_buffers", "DynamicShapeUnsupported", "SizeGuard", "SizeSource", "is_size_symbol", "kernel_size_symbols",
    "float_symbol", "is_float_symbol", "size_param_ctype",
    "is_symbolic", "size_symbol", "size_symbols_of", "substitute_hints", "sym_expr",
    "COLLECTIVES", "WAIT_TENSOR", "WRAP_TENSOR", "issues_collective",
    "SymScalar", "python_scalar", "sym_scalar", "DerivedSize",
]
