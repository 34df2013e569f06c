"""GraphAnnotations: what travels with a GraphModule between stages, through one accessor pair."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import fx

from kiln.graph import (
    NO_ANNOTATIONS,
    CompiledGraph,
    GraphAnnotations,
    SymbolicSize,
    annotate,
    annotations_of,
)


def _gm() -> fx.GraphModule:
    return fx.symbolic_trace(lambda x, y: (x + y,))


def test_a_graph_without_annotations_has_the_empty_ones() -> None:
    assert annotations_of(_gm()) is NO_ANNOTATIONS
    assert NO_ANNOTATIONS.layout_free_outputs is None and NO_ANNOTATIONS.input_mutations == ()


def test_annotate_then_read_back_and_copy_with_replace() -> None:
    gm = _gm()
    ann = GraphAnnotations(input_sources=("L['x']", "L['y']"), module_state=(1,),
                           symbolic_sizes=(SymbolicSize(0, 0, "s0"),))
    annotate(gm, ann)
    assert annotations_of(gm) is ann
    annotate(gm, dataclasses.replace(annotations_of(gm), input_mutations=((0, 1),)))
    got = annotations_of(gm)
    assert got.input_mutations == ((0, 1),) and got.module_state == (1,) and got.input_sources[0] == "L['x']"
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.module_state = ()  # type: ignore[misc]


def test_annotations_travel_when_a_pass_copies_the_graph_meta() -> None:
    gm = _gm()
    annotate(gm, GraphAnnotations(layout_free_outputs=(0,)))
    copy = fx.GraphModule(gm, gm.graph)
    copy.meta.update(gm.meta)  # what passes that build a new GraphModule do
    assert annotations_of(copy).layout_free_outputs == (0,)


def test_annotate_refuses_anything_else() -> None:
    with pytest.raises(TypeError, match="GraphAnnotations"):
        annotate(_gm(), {"input_mutations": ()})  # type: ignore[arg-type]


def test_compiled_graph_fields_are_declared_and_frozen() -> None:
    cg = CompiledGraph(lambda *a: a, "test", {"stage": "text"})
    # (CPython 3.11 raises TypeError for an undeclared name on a frozen slots dataclass)
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        cg.extra = 1  # type: ignore[attr-defined]
    moved = dataclasses.replace(cg, output_strides=((1,),))
    assert moved.backend == "test" and moved.output_strides == ((1,),) and moved.texts == {"stage": "text"}
    assert moved(torch.ones(1))[0].item() == 1.0
