"""kiln.autograd's passes, in order — the whole stage read top to bottom.

1. trace      run the torch graph on fake tensors under TracingMode: a functional ATen graph,
              joint forward+backward (training) or forward-only (inference / no grad)
2. verify     the result is in the ``aten`` dialect (KILN_VERIFY=1)
3. recompute  training BatchNorm outputs written as their pointwise expression (recompute.py), so
              the partitioner may rebuild what follows them in the backward instead of saving it
4. partition  split the joint graph into forward and backward (min-cut or save-all)
5. decompose  the table applied to what the trace kept whole for 3-4 (BatchNorm's functional form):
              the halves leave this stage decomposed, and say so (GraphAnnotations.decomposed_by)
6. verify     both halves are ``aten`` (KILN_VERIFY=1)
Compilation of the halves and the run-time wrapper follow in ``aot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from kiln.graph import KNOBS, ExampleInput, verify

from .joint import (
    JointGraph,
    finish_decomposition,
    module_state_names,
    trace_inference,
    trace_joint,
)
from .partition import Partitioned, PartitionerName, partition
from .recompute import expose_batch_norm_outputs, shape_only_arguments
from .tracer import Decompositions


@dataclass(frozen=True)
class AotOptions:
    partitioner: PartitionerName = "min_cut"
    decompositions: Decompositions | None = None
    verify: bool = KNOBS.verify
    recompute_norms: bool = True  # min_cut only: see recompute.py


def wants_grad(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Traced with grad when grad mode is on and an input or a parameter of ``gm`` requires grad, or
    ``gm`` makes a leaf that requires grad itself (``makes_grad_leaves``)."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return True
    if makes_grad_leaves(gm):
        return True
    return bool(module_state_names(gm)) and any(p.requires_grad for p in gm.parameters())


def makes_grad_leaves(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` makes tensors that require grad out of none that do: ``t.requires_grad_()`` (the
    parameters of a module built inside compiled code) or a factory called with ``requires_grad=True``."""
    for n in gm.graph.nodes:
        if n.op == "call_method" and n.target == "requires_grad_":
            flag = n.args[1] if len(n.args) > 1 else n.kwargs.get("requires_grad", True)
            if flag is not False:
                return True
        elif n.op == "call_function" and n.kwargs.get("requires_grad") is True:
            return True
    return False


def run_aot_pipeline(gm: fx.GraphModule, example_inputs: Sequence[ExampleInput],
                     opts: AotOptions) -> tuple[JointGraph, Partitioned | None]:
    if wants_grad(gm, example_inputs):
        joint = trace_joint(gm, example_inputs, decompositions=opts.decompositions)
    else:
        joint = trace_inference(gm, example_inputs, decompositions=opts.decompositions)
    if opts.verify:
        verify(joint.gm, "aten")
    if not joint.joint:
        return joint, None
    if opts.recompute_norms and opts.partitioner == "min_cut":
        expose_batch_norm_outputs(joint.gm)
        shape_only_arguments(joint.gm)
        if opts.verify:
            verify(joint.gm, "aten")
    parts = partition(joint, opts.partitioner)
    parts = replace(parts, fw_gm=finish_decomposition(parts.fw_gm, opts.decompositions),
                    bw_gm=finish_decomposition(parts.bw_gm, opts.decompositions))
    if opts.verify:
        verify(parts.fw_gm, "aten")
        verify(parts.bw_gm, "aten")
    return joint, parts
