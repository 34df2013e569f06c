"""GraphModules whose Python code is generated on first use.

``fx.GraphModule(root, graph)`` generates and compiles the graph's Python code at once (``recompile``);
kiln hands most graphs it builds (the joint trace, the partitioned forward and backward, the
decomposed copies) to the next stage, which reads the nodes and never runs the code: for a
transformer's training graphs that was ~0.5 s of a compile. torch's ``_LazyGraphModule`` defers the
code until the module is called, printed or its ``code`` read. It is private to torch.fx, so it is
used only where it exists with the methods relied on; otherwise a plain GraphModule is made.
"""

from __future__ import annotations

import torch
from torch import fx


def _lazy_class() -> type[fx.GraphModule]:
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fx.GraphModule
    if not all(hasattr(_LazyGraphModule, a) for a in ("real_recompile", "_lazy_forward")):
        return fx.GraphModule
    return _LazyGraphModule  # type: ignore[no-any-return]


LAZY_GRAPH_MODULE = _lazy_class()


def lazy_graph_module(root: torch.nn.Module | dict[str, object], graph: fx.Graph) -> fx.GraphModule:
    """``fx.GraphModule(root, graph)`` whose code is generated when first needed (module docstring)."""
    return LAZY_GRAPH_MODULE(root, graph)
