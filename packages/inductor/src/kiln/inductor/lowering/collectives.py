"""Functional collectives (``_c10d_functional.*``) and their ``wait_tensor``: calls the wrapper makes
in program order.

Note: a collective returns at once with its output still being written (and its operands still being
read) by the communication; the matching ``wait_tensor`` blocks until that is done and returns the
output itself (an alias, though the schema does not say so). So for the memory plan, the arena and
in-place writes:

- the wait *holds* the collective's operands and outputs (``ExternKernel.holds``): they count as
  read at the wait, so none of them is freed, handed to a later buffer or written over in place
  while the communication runs;
- the wait's output and the collective's output are one storage (scheduler/memory.py gives them one
  lifetime and hands their memory on once).

Collectives keep their program order: externs are never reordered (scheduler/fusion.py), so every
rank issues them in the order the graph lists them; and a read of a collective's output (eager code
may read the tensor it waited on) joins no kernel that runs before its wait.

A wait takes the collective's output or a view of it (torch's views are strided, so lowering keeps
them as views of that buffer); a wait on a value computed from the output reads it before the wait,
as eager does. Functional graphs (funcol, DTensor) wait on the output itself.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ..ir import (
    COLLECTIVES,
    WAIT_TENSOR,
    WRAP_TENSOR,
    ExternKernel,
    args_buffers,
    issues_collective,
    node_outputs,
)
from .common import Rule
from .context import LoweringContext
from .extern import extern_call
from .values import Strided

RULES: dict[str, Rule] = {}


def _collective(ctx: LoweringContext, node: fx.Node, *args: Any, **kwargs: Any) -> Any:
    return extern_call(ctx, node, "extern", args, kwargs)


def _issuer(ctx: LoweringContext, buffer: str) -> ExternKernel | None:
    """The collective call whose output ``buffer`` is, if any."""
    for n in reversed(ctx.nodes):
        if buffer in node_outputs(n):
            return n if isinstance(n, ExternKernel) and issues_collective(n.target) else None
    return None


def _wait(ctx: LoweringContext, node: fx.Node, tensor: Any) -> Any:
    issuer = _issuer(ctx, tensor.buffer) if isinstance(tensor, Strided) else None
    holds: tuple[str, ...] = ()
    if issuer is not None:
        operands = args_buffers(issuer.args) + args_buffers(tuple(v for _, v in issuer.kwargs))
        holds = tuple(dict.fromkeys(b for b in (*operands, *node_outputs(issuer)) if b != tensor.buffer))
    # a wait on a tensor the graph did not issue (an input) waits for work issued before the call
    return extern_call(ctx, node, "extern", (tensor,), {}, holds=holds)


def _same_tensor(ctx: LoweringContext, node: fx.Node, tensor: Any) -> Any:
    """Eager wraps a collective's result in an AsyncCollectiveTensor (a subclass without storage of
    its own, which kernels cannot take): in a graph, after the wait, it is the tensor itself."""
    return tensor


RULES[WAIT_TENSOR] = _wait
RULES[WRAP_TENSOR] = _same_tensor
for _name in COLLECTIVES:  # (the in-place all_reduce_ stays a fallback: memory.py keeps its memory apart)
    RULES[_name] = _collective
