"""kiln.capture: a symbolic interpreter of CPython 3.11-3.13 bytecode that captures torch-dialect
FX graphs with guards, graph breaks (resume functions), recompiles and dynamic shapes.

Public API: ``optimize``, ``explain``, ``capture_graph``, ``mark_dynamic``, ``reset``,
``cache_entries``, ``recompile_count``, ``Unsupported``.
"""

from .capture import refresh_shape_guards
from .errors import Unsupported
from .explain import ExplainOutput, capture_graph, explain
from .optimize import cache_entries, mark_dynamic, mark_static, optimize, recompile_count, reset

__all__ = ["ExplainOutput", "Unsupported", "cache_entries", "capture_graph", "explain", "mark_dynamic", "mark_static",
           "optimize", "recompile_count", "refresh_shape_guards", "reset"]
