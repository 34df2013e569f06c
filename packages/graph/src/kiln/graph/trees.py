"""Mapping over an op's arguments (what every stage's tracer does per recorded op)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._pytree import tree_map


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree_map(fn, tree)`` for an op's arguments: plain tuples, lists and dicts are rebuilt here (much
    faster than pytree's flatten/unflatten); any other container goes through ``tree_map``."""
    cls = type(tree)
    if cls is tuple or cls is list:
        return cls([map_leaves(fn, x) for x in tree])
    if cls is dict:
        return {k: map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list, dict)):  # namedtuples, torch.Size, OrderedDict...
        return tree_map(fn, tree)
    if tree is None and not _NONE_IS_LEAF:
        return None
    return fn(tree)


# whether pytree hands None to the function (a leaf) or keeps it (a node without children): it
# changed between torch versions
_NONE_IS_LEAF = tree_map(lambda x: True, None) is True
