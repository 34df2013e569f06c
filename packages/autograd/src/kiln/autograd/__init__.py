"""kiln.autograd: functionalization, joint forward+backward ATen graphs, min-cut partitioning, and the
run-time autograd wrapper — PyTorch's AOTAutograd stage rebuilt, usable alone.

    compiled = kiln.autograd.aot(gm, example_inputs, fw_compiler=my_compiler)
    any front end with the backend contract: backend=kiln.autograd.aot_eager
"""

from .aot import AotResult, aot, aot_eager, run_graph_compiler
from .errors import AutogradTraceError, DoubleBackwardError
from .joint import JointGraph, trace_inference, trace_joint
from .partition import Partitioned, partition
from .pipeline import AotOptions
from .portable import load_program, render_graph_module, training_program
from .signature import GraphSignature, OutputInfo, OutputKind
from .tracer import Decompositions

__all__ = [
    "AotOptions", "AotResult", "AutogradTraceError", "Decompositions", "DoubleBackwardError",
    "GraphSignature", "JointGraph", "OutputInfo", "OutputKind", "Partitioned", "aot", "aot_eager",
    "load_program", "partition", "render_graph_module", "run_graph_compiler", "trace_inference",
    "trace_joint", "training_program",
]
