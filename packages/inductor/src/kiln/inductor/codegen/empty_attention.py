"""Attention externs over an empty query or key sequence: their outputs made without calling the kernel.

ATen's fused attention kernels are not written for empty sequences: CPU flash attention
(``_scaled_dot_product_flash_attention_for_cpu``) divides by its block count and kills the process with
SIGFPE for a query or key length of 0 (or 0 heads). Eager never meets this: the composite
``F.scaled_dot_product_attention`` runs MATH on empty inputs. A graph compiled over symbolic sizes calls
the kernel it traced at every size, so both wrappers branch on the sizes below at run time (a call whose
sizes are known to be 0 makes only the outputs; one known non-empty, only the call).

What the kernel would mean on empty inputs, as MATH computes it: attending to no key gives 0 (the output
is zeros), the logsumexp of no scores is -inf; every other output (philox seed and offset, cumulative
sequence lengths, the debug mask) is zeros of its traced layout, read only by the matching backward,
which then takes the same branch; every gradient is zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir import ExternKernel, ExternOutput, TensorRef


@dataclass(frozen=True, slots=True)
class AttentionOperands:
    query: int  # positions of the query and key among the op's arguments
    key: int
    backward: bool


_FORWARD, _BACKWARD = AttentionOperands(0, 1, False), AttentionOperands(1, 2, True)
EMPTY_ATTENTION: dict[str, AttentionOperands] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _FORWARD,
    "aten._scaled_dot_product_flash_attention.default": _FORWARD,
    "aten._scaled_dot_product_efficient_attention.default": _FORWARD,
    "aten._scaled_dot_product_cudnn_attention.default": _FORWARD,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _BACKWARD,
    "aten._scaled_dot_product_flash_attention_backward.default": _BACKWARD,
    "aten._scaled_dot_product_efficient_attention_backward.default": _BACKWARD,
    "aten._scaled_dot_product_cudnn_attention_backward.default": _BACKWARD,
}


@dataclass(frozen=True, slots=True)
class EmptyCheck:
    """The sizes whose value 0 makes the call empty (those not known to be positive), and whether one of
    them is known to be 0 (the call is always empty)."""
    sizes: tuple[sympy.Expr, ...]
    always: bool


def empty_check(e: ExternKernel) -> EmptyCheck | None:
    """For an attention extern: the sizes to test (query batch, heads and length, key heads and length);
    None for any other extern, or when every such size is known to be positive."""
    ops = EMPTY_ATTENTION.get(e.target)
    if ops is None or max(ops.query, ops.key) >= len(e.args):
        return None
    q, k = e.args[ops.query], e.args[ops.key]
    if not isinstance(q, TensorRef) or not isinstance(k, TensorRef) or len(q.shape) < 2 or len(k.shape) < 2:
        return None
    sizes: list[sympy.Expr] = []
    for s in (*q.shape[:-1], *k.shape[1:-1]):
        s = sympy.sympify(s)
        if s.is_zero:
            return EmptyCheck((s,), True)
        if not _positive(s) and s not in sizes:
            sizes.append(s)
    return EmptyCheck(tuple(sizes), False) if sizes else None


def _positive(s: sympy.Expr) -> bool:
    """``s`` is positive for every value of its size symbols, each taken as any integer >= 0 (whatever
    assumptions the symbols carry: a symbolic size may be 0 at run time)."""
    plain = {x: sympy.Dummy(integer=True, nonnegative=True) for x in s.free_symbols}
    return bool(s.xreplace(plain).is_positive)


def fill_value(e: ExternKernel, o: ExternOutput) -> float:
    """What output ``o`` of the empty call holds: -inf for a forward's logsumexp, else 0."""
    ret = o.path[0] if o.path else 0
    return float("-inf") if not EMPTY_ATTENTION[e.target].backward and ret == 1 else 0.0
