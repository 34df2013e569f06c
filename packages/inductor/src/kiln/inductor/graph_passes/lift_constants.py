"""Tensor constants of a graph (``get_attr`` nodes) become trailing graph inputs.

Why: a captured graph can read a tensor that no input produced, e.g. HF's ``DynamicCache`` starts each
layer's cache as ``torch.tensor([])`` and concatenates onto it; tracing keeps such a tensor as a
``get_attr`` of the graph module. Lowering reads only placeholders, so the whole graph used to run op by
op through ATen. Here each such tensor becomes a placeholder after the graph's own inputs; the compiled
function appends the tensors to every call, and a saved program carries their bytes and loads them once
(``kiln.runtime.program_helpers.load_constant``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def lift_constants(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """A copy of ``gm`` whose tensor ``get_attr`` nodes are placeholders after its inputs, and the tensors
    (in that order). ``gm`` itself when it reads none; other attributes (``torch.cond`` branches) stay."""
    reads = [n for n in gm.graph.nodes if n.op == "get_attr" and isinstance(_attr(gm, str(n.target)), torch.Tensor)]
    if not reads:
        return gm, []
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        env[n] = graph.node_copy(n, lambda a: env[a])
    constants: list[torch.Tensor] = []
    for n in reads:
        ph = graph.placeholder(f"const_{n.name}")
        ph.meta = dict(n.meta)
        env[n] = ph
        constants.append(_attr(gm, str(n.target)))
    for n in gm.graph.nodes:
        if n not in env:
            env[n] = graph.node_copy(n, lambda a: env[a])
    lifted = fx.GraphModule(gm, graph)
    lifted.meta.update(gm.meta)
    return lifted, constants


class WithConstants:
    """A compiled graph whose trailing inputs are its constants: callers pass the graph's own inputs."""

    __slots__ = ("inner", "constants")

    def __init__(self, inner: Any, constants: Sequence[torch.Tensor]) -> None:
        self.inner, self.constants = inner, tuple(constants)

    def __call__(self, *args: Any) -> tuple:
        return self.inner.call_owned([*args, *self.constants])  # type: ignore[no-any-return]

    def call_owned(self, args: list) -> tuple:
        args.extend(self.constants)
        return self.inner.call_owned(args)  # type: ignore[no-any-return]


def constants_epilogue(constants: Sequence[torch.Tensor]) -> tuple[str, dict[str, bytes]]:
    """Source appended to a saved wrapper (its ``call_owned`` then appends the constants, loaded once
    from the program's files) and those files. Raises ValueError for a constant with no data (a fake
    or meta tensor: cross-compilation traced it without values)."""
    files: dict[str, bytes] = {}
    rows = []
    for i, t in enumerate(constants):
        if t.device.type == "meta" or isinstance(t, FakeTensor):
            raise ValueError(f"graph constant {i} ({type(t).__name__} on {t.device}) has no data to save")
        key = f"const_{i}.bin"
        data = t.detach().contiguous().cpu()
        files[key] = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""  # 0-d too
        rows.append(f"    _load_constant(FILES, {key!r}, {list(t.shape)}, {list(t.stride())}, {t.dtype}, "
                    f"{str(t.device)!r}),")
    src = ("\n\nfrom kiln.runtime.program_helpers import load_constant as _load_constant\n"
           "_CONSTANTS = (\n" + "\n".join(rows) + "\n)\n"
           "_call_owned_graph = call_owned\n\n\n"
           "def call_owned(args):  # the graph's constants follow its inputs\n"
           "    args.extend(_CONSTANTS)\n"
           "    return _call_owned_graph(args)\n")
    return src, files
