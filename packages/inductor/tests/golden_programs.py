"""Loop programs lowered from small ATen graphs: the round-trip corpus of the IR parser and the inputs
of the golden pass tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from tracer import trace

from kiln.inductor import InductorOptions, decomp_bridge
from kiln.inductor.ir import LoopProgram
from kiln.inductor.lowering.lower import lower_graph


def lower(fn: Callable[..., Any], *args: torch.Tensor, name: str = "g") -> LoopProgram:
    """``fn``'s ATen graph, decomposed as inductor does, lowered to loop IR (no scheduling, no codegen)."""
    gm = trace(fn, *args)
    decomp_bridge.ensure_meta(gm, list(args))
    gm = decomp_bridge.decompose(gm, list(args))
    program, _ = lower_graph(gm, list(args), InductorOptions(strict_lowering=True), name)
    return program


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def _i(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape)


# name -> (function, example inputs)
CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "pointwise": (lambda x, y: (x.sin() + y * 2).relu(), (_r(4, 8), _r(4, 8))),
    "broadcast_where": (lambda x, y: torch.where(x > 0, x, y - 1.5), (_r(4, 8), _r(8))),
    "softmax": (lambda x: x.softmax(-1), (_r(6, 10),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), (_r(3, 5, 16), _r(16), _r(16))),
    "sum_max_argmax": (lambda x: (x.sum(0), x.amax(1), x.argmax(1)), (_r(7, 9),)),
    "transpose_reshape": (lambda x: (x.transpose(0, 1).reshape(6, 4) * 3).exp(), (_r(4, 6),)),
    "split_merge_dims": (lambda x: x.reshape(2, 3, 4).permute(2, 0, 1).contiguous().reshape(24) + 1, (_r(6, 4),)),
    "cumsum": (lambda x: x.cumsum(1), (_r(3, 12),)),
    "embedding": (lambda w, idx: F.embedding(idx, w) * 2, (_r(10, 4), _i(10, 3, 5))),
    "index_add": (lambda x, idx, v: x.index_add(0, idx, v), (_r(6, 3), _i(6, 4), _r(4, 3))),
    "cat_pad": (lambda x, y: F.pad(torch.cat([x, y], 1), (1, 2)), (_r(3, 4), _r(3, 2))),
    "int_and_casts": (lambda x, n: (x.to(torch.float16) * 2).to(torch.float32) + (n // 3 % 5).float(),
                      (_r(5, 4), _i(100, 5, 4))),
    "matmul_epilogue": (lambda a, b, c: torch.relu(a @ b + c), (_r(8, 16), _r(16, 4), _r(4))),
    "linear_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), (_r(4, 8), _r(6, 8), _r(6))),
    "dropout": (lambda x: F.dropout(x, 0.5, training=True), (_r(4, 8),)),
    "bool_logic": (lambda x, y: ((x > 0) & ~(y < 0.5)) | x.isnan(), (_r(4, 4), _r(4, 4))),
    "max_pool": (lambda x: F.max_pool2d(x, 2), (_r(1, 2, 6, 6),)),
    "dead_code": (lambda x: (x + 1, (x * 2).sum())[0], (_r(5),)),
    "long_reduction": (lambda x: x.sum(), (_r(4096),)),
    # independent pointwise kernels of other sizes and loop nests, and one depending on a reduction
    "independent_updates": (lambda a, b, c: (a * 0.9 + 1.0, b.t() * 2.0, (c - a.sum()).exp()),
                            (_r(7), _r(3, 5), _r(4))),
}


def corpus() -> dict[str, LoopProgram]:
    torch.manual_seed(0)
    return {name: lower(fn, *args, name=name) for name, (fn, args) in CASES.items()}
