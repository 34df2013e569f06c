"""The seam to kiln.decomp and fake-tensor metadata.

Note: inductor decomposes with kiln.decomp's ``inductor`` table *minus* the ops it lowers natively
(softmax, layer_norm, ...): one fused kernel from a dedicated lowering beats the same op's
decomposition. In kiln's pipeline that table is applied once, by kiln.autograd while it traces
(the meta-package hands it over); the graphs say so (``GraphAnnotations.decomposed_by``) and the
``decompose`` pass here copies them instead of re-tracing. Graphs from other front ends are
decomposed here. Leftover non-core ops are not an error here (``check=False``, even under
KILN_VERIFY): lowering either handles them or runs them as ATen fallbacks, reported in perf_hints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import kiln.decomp as _decomp
from kiln.graph import autocast_off, shape_env_of, symbolic_dispatch, target_name

from .lowering.registry import LOWERINGS

TABLE_NAME = "inductor_lowering"  # GraphAnnotations.decomposed_by of graphs traced with it


def inductor_decompositions() -> _decomp.DecompTable:
    """kiln.decomp's ``inductor`` table without the ops kiln.inductor lowers itself; also what the
    meta-package's backend hands kiln.autograd to apply while tracing (the graphs it traces then say
    so, and ``decompose`` below does not re-run the table on them)."""
    table = _decomp.table("inductor")
    return _decomp.DecompTable(TABLE_NAME, [e for e in table.entries() if target_name(e.op) not in LOWERINGS
                                            or target_name(e.op) in _REWRITES_BEFORE_LOWERING], None)


# Ops inductor lowers (as an extern call) whose ``inductor`` table rule is a performance rewrite that applies
# in a narrow case and otherwise leaves the op to its lowering: bmm with an inner size of 1 is an outer
# product, a broadcast multiply that fuses into its consumers (Llama's rotary frequencies, position x
# inverse frequency: as an extern its [B, D/2, S] result was read transposed by every layer's q/k
# kernel, which then ran as a 2-D tile, 2.6x torch.compile's time on an H200).
_REWRITES_BEFORE_LOWERING = frozenset({"aten.bmm.default"})


def decompose(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``gm`` with the table applied: re-traced, or copied when it was traced with the table already."""
    out = _decomp.decompose(gm, inductor_decompositions(), check=False)
    ensure_meta(out, example_inputs)
    return out


def ensure_meta(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Run the graph on fake tensors to fill missing ``meta['val']`` (hand-built graphs, or the few
    nodes a rewrite such as pad_matmuls added): only the missing nodes run when the others carry
    fake values of one mode; otherwise the whole graph runs in a fresh mode."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("output",)]
    if stale_devices(gm, example_inputs):  # traced on one device, compiled for another (cross-compiling)
        for n in nodes:
            n.meta.pop("val", None)
    if all("val" in n.meta for n in nodes):
        return
    mode = _mode_of_existing(nodes)
    if mode is None:
        _propagate(gm, example_inputs, FakeTensorMode(allow_non_fake_inputs=True), reuse=False)
    else:
        _propagate(gm, example_inputs, mode, reuse=True)


def stale_devices(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether a placeholder's value sits on another device than its example input: the values then
    describe another compile (a graph traced on CPU compiled for CUDA) and the backend, lowering and
    wrapper would read the wrong devices from them."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, ex in zip(placeholders, example_inputs):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and isinstance(ex, torch.Tensor) and v.device != ex.device:
            return True
    return False


def _mode_of_existing(nodes: list[fx.Node]) -> FakeTensorMode | None:
    """The one fake mode of every existing value, when the missing ones can be computed in it."""
    modes = set()
    for n in nodes:
        if "val" not in n.meta:
            if n.op != "call_function":
                return None  # a placeholder/get_attr without a value: start over
            continue
        for v in pytree.tree_leaves(n.meta["val"]):
            if isinstance(v, FakeTensor):
                modes.add(v.fake_mode)
            elif isinstance(v, torch.Tensor):
                return None
    return modes.pop() if len(modes) == 1 else None


def _propagate(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: FakeTensorMode, reuse: bool) -> None:
    env: dict[fx.Node, Any] = {}
    it = iter(example_inputs)

    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            return mode.from_tensor(x)
        return x

    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    with mode, autocast_off(), symbolic_dispatch(shape_env_of([*placeholders, *example_inputs]) is not None):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                v, ex = n.meta.get("val"), next(it, None)
                env[n] = v if v is not None else conv(ex)
            elif reuse and "val" in n.meta:
                env[n] = n.meta["val"]
            elif n.op == "call_function":
                args = fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
                env[n] = n.target(*args, **kwargs)
            elif n.op == "get_attr":
                env[n] = conv(getattr(gm, n.target))
            else:
                continue
            if "val" not in n.meta:
                n.meta["val"] = env[n]
