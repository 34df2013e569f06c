"""kiln.capture: a symbolic interpreter of CPython 3.11-3.13 bytecode that captures torch-dialect
FX graphs with guards, graph breaks (resume functions), recompiles and dynamic shapes.

Public API: ``optimize``, ``explain``, ``capture_graph``, ``mark_dynamic``, ``reset``,
``cache_entries``, ``recompile_count``, ``Unsupported``; torch.compiler's controls ``disable``,
``allow_in_graph``, ``is_compiling``, ``set_stance``, ``mark_static`` (controls.py); ``call_with_forward``
(a module called by nn.Module's own call, hooks included, with a compiled forward).
"""

from .capture import refresh_shape_guards
from .controls import allow_in_graph, disable, is_compiling, mark_static, set_stance
from .errors import Unsupported
from .explain import ExplainOutput, capture_graph, explain
from .module_calls import call_with_forward
from .optimize import cache_entries, mark_dynamic, optimize, recompile_count, reset

__all__ = ["ExplainOutput", "Unsupported", "allow_in_graph", "cache_entries", "call_with_forward", "capture_graph",
           "disable", "explain", "is_compiling", "mark_dynamic", "mark_static", "optimize", "recompile_count",
           "refresh_shape_guards", "reset", "set_stance"]
