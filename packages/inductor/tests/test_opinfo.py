"""Op tests generated from op_db sample inputs for the ops kiln.inductor lowers, compared with eager.

Samples of several ops are traced into one graph (one g++ build per group keeps the suite fast);
each op is still its own test and checks every one of its samples.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from helpers import assert_close
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_unflatten
from tracer import flat_outputs, trace

from kiln.inductor import InductorOptions, compile_graph, lowered_ops

SKIP = {"empty", "empty_like", "empty_strided", "new_empty", "randn", "randn_like", "rand_like", "bernoulli",
        "as_strided", "new_empty_strided", "sort", "topk", "matmul", "unbind", "split", "split_with_sizes", "masked_fill"}
SAMPLES_PER_OP = 4
GROUP = 10

_lowered = {o.split(".")[1] for o in lowered_ops()}
OPS = sorted((o for o in op_db if o.name in _lowered and o.variant_test_name == "" and o.name not in SKIP),
             key=lambda o: o.name)


def _dtype(op: Any) -> torch.dtype | None:
    for d in (torch.float32, torch.int64, torch.bool):
        if d in op.supported_dtypes("cpu"):
            return d
    return None


def _samples(op: Any) -> list[Any]:
    d = _dtype(op)
    if d is None:
        return []
    out = []
    for s in op.sample_inputs("cpu", d, requires_grad=False):
        try:
            op.op(s.input, *s.args, **s.kwargs)
        except Exception:
            continue
        out.append(s)
        if len(out) == SAMPLES_PER_OP:
            break
    return out


def _call(op: Any, s: Any, tensors: list[torch.Tensor], spec: Any, slots: list[int], leaves: list[Any]) -> Any:
    flat = list(leaves)
    for k, t in zip(slots, tensors):
        flat[k] = t
    inp, args, kwargs = tree_unflatten(flat, spec)
    return op.op(inp, *args, **kwargs)


@functools.cache
def _group(index: int) -> tuple[Any, list[tuple[str, int, int]], list[torch.Tensor]]:
    """Compile the samples of ops[index*GROUP : ...] as one graph; return (compiled, layout, inputs)."""
    entries = []
    inputs: list[torch.Tensor] = []
    for op in OPS[index * GROUP:(index + 1) * GROUP]:
        for s in _samples(op):
            leaves, spec = tree_flatten((s.input, s.args, s.kwargs))
            slots = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            entries.append((op, s, spec, slots, leaves, len(inputs)))
            inputs += [leaves[k] for k in slots]

    def f(*ts: torch.Tensor) -> tuple:
        outs: list[Any] = []
        for op, s, spec, slots, leaves, start in entries:
            res = flat_outputs(_call(op, s, list(ts[start:start + len(slots)]), spec, slots, leaves))
            outs += [r for r in res if isinstance(r, torch.Tensor)]
        return tuple(outs)
    gm = trace(f, *inputs)
    cg = compile_graph(gm, inputs, options=InductorOptions(strict_lowering=True))
    got = cg.fn(*inputs)
    want = f(*inputs)
    layout: list[tuple[str, int, int]] = []
    pos = 0
    for op, s, spec, slots, leaves, _start in entries:
        n = len([r for r in flat_outputs(_call(op, s, [leaves[k] for k in slots], spec, slots, leaves))
                 if isinstance(r, torch.Tensor)])
        layout.append((op.name, pos, n))
        pos += n
    return (got, want), layout, inputs


@pytest.mark.parametrize("op_name", [o.name for o in OPS])
def test_op_matches_eager(op_name: str) -> None:
    index = next(k for k, o in enumerate(OPS) if o.name == op_name) // GROUP
    (got, want), layout, _ = _group(index)
    rows = [r for r in layout if r[0] == op_name]
    if not rows:
        pytest.skip(f"op_db has no runnable sample for {op_name}")
    for _, pos, n in rows:
        for g, w in zip(got[pos:pos + n], want[pos:pos + n]):
            assert_close(g, w, atol=1e-4, rtol=1e-4)
