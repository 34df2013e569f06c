"""Outer loops follow the memory order of the first store (scheduler/loop_order.py)."""

from __future__ import annotations

import torch

from kiln.inductor.codegen.triton.testing import node, xs
from kiln.inductor.ir import IndexValue, Load
from kiln.inductor.scheduler.loop_order import order_outer_loops


def test_a_transposed_store_is_walked_in_memory_order() -> None:
    x0, x1 = xs(2)
    outer, nodes = order_outer_loops((4, 6), [node("out", Load("a", 6 * x0 + x1, torch.float32), 4 * x1 + x0,
                                                    role="outer")])
    assert outer == (6, 4)
    assert nodes[0].store_index == 4 * x0 + x1  # the stored dim is now the fast one
    assert nodes[0].body.index == x0 + 6 * x1  # every index is renamed consistently


def test_contiguous_stores_keep_their_order() -> None:
    x0, x1 = xs(2)
    n = node("out", Load("a", 4 * x1 + x0, torch.float32), 6 * x0 + x1, role="outer")
    assert order_outer_loops((4, 6), [n]) == ((4, 6), [n])


def test_indirect_store_bodies_are_renamed_too() -> None:
    # a scatter's indirect store reads the loop vars: it must be renamed with everything else
    x0, x1 = xs(2)
    plain = node("out", Load("a", 6 * x0 + x1, torch.float32), 4 * x1 + x0, role="outer")
    scatter = node("dst", Load("b", 6 * x0 + x1, torch.float32), x1, role="outer")
    scatter = type(scatter)(**{**{f: getattr(scatter, f) for f in scatter.__dataclass_fields__},
                               "store_indirect": (IndexValue(x0, torch.int64),)})
    _, nodes = order_outer_loops((4, 6), [plain, scatter])
    assert nodes[1].store_indirect[0].index == x1
