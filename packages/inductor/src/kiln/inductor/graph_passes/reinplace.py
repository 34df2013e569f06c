"""Input mutations done in place.

A functional graph returns the new value of an input it mutated (BatchNorm statistics, a KV cache
written with ``index_copy_``) and the caller copies it back. For a KV cache that means copying the
whole cache twice per decode step (the functional ``index_put`` clones it, the write-back copies it
again) to change one row. When kiln.autograd says which outputs are new input values
(``GraphAnnotations.input_mutations``: (output position, input position) pairs) and the value is an
``index_put`` of that very input, whose only reader is this ``index_put``, the op runs in place on the
input (``index_put_``) and the write-back finds nothing to copy.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.graph import annotations_of

aten = torch.ops.aten


def reinplace_input_mutations(gm: fx.GraphModule) -> int:
    pairs = annotations_of(gm).input_mutations
    if not pairs:
        return 0
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    count = 0
    for out_pos, in_pos in pairs:
        if out_pos >= len(outs) or in_pos >= len(placeholders):
            continue
        value, inp = outs[out_pos], placeholders[in_pos]
        if len(inp.users) != 1 or not isinstance(value, fx.Node) or value.op != "call_function" or \
                value.target is not aten.index_put.default or value.args[0] is not inp:
            continue
        value.target = aten.index_put_.default
        count += 1
    if count:
        gm.recompile()
    return count
