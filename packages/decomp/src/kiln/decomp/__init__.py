"""kiln.decomp: decomposition tables (ATen -> core ATen -> kiln prims) and a dispatcher re-tracer.

    from kiln.decomp import table, decompose
    gm = decompose(aten_gm, table("core_aten"))      # passes kiln.graph.verify(gm, "core_aten")

``table(name)`` is a read-only ``Mapping[OpOverload, Callable]`` whose rules are plain Python over
``torch.ops.aten`` calls, so any dispatch-mode tracer can apply them (``table[op](*args, **kwargs)``).
``decompose`` also accepts torch-dialect graphs: it re-traces them through the dispatcher.
"""

from .pipeline import lower
from .registry import TABLE_NAMES, Decomposition, DecompTable, register, select
from .retrace import decompose, normalize_args, trace
from .tables import table
from .tracer import DecompositionError, GraphRecorder

__all__ = [
    "TABLE_NAMES", "DecompTable", "Decomposition", "DecompositionError", "GraphRecorder",
    "decompose", "lower", "normalize_args", "register", "select", "table", "trace",
]
