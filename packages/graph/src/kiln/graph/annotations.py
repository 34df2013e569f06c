"""What travels with a GraphModule from one stage to the next, typed and frozen (DESIGN.md).

A stage writes a graph's annotations with ``annotate`` and a later stage reads them with
``annotations_of``; those two functions are the only code that touches their ``gm.meta`` entry.
Node-level ``meta`` keys that more than one stage reads are listed in ``NODE_META_KEYS`` (a rule
test, tests/test_rules.py, fails on any other key that crosses a package boundary).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx


@dataclass(frozen=True, slots=True)
class SymbolicSize:
    """A size that varies between calls: dimension ``dim`` of placeholder ``input`` is ``symbol``."""

    input: int
    dim: int
    symbol: str


@dataclass(frozen=True, slots=True)
class DistributedState:
    """The process group a graph's collectives run on (a graph of one rank of a job)."""

    world_size: int
    rank: int
    group: str = "default"


@dataclass(frozen=True, slots=True)
class GraphAnnotations:
    """Facts about a graph that its nodes do not say, for the stages after the one that knows them.

    Positions count placeholders (inputs) and entries of the output tuple (outputs), from 0.
    """

    # capture: where each placeholder's value comes from, e.g. "L['x']" (a graph's identity in caches)
    input_sources: tuple[str, ...] = ()
    # capture: placeholders holding module parameters and buffers (static inputs of CUDA graphs)
    module_state: tuple[int, ...] = ()
    # autograd (inference graphs): (output position, input position) pairs, the output being the new
    # value of a mutated input that is written back after the call; a compiler may update in place
    input_mutations: tuple[tuple[int, int], ...] = ()
    # autograd (training forward graphs): outputs only a later compiled graph reads (saved
    # activations), whose strides the compiler may choose; None: the graph has no such contract
    layout_free_outputs: tuple[int, ...] | None = None
    # sizes that vary between calls (empty: every size is static)
    symbolic_sizes: tuple[SymbolicSize, ...] = ()
    # set when the graph is one rank's part of a distributed program
    distributed: DistributedState | None = None
    # autograd: the name of the kiln.decomp table its trace applied ("" none); decomposing the graph
    # with that table again would rebuild the same graph, so kiln.decomp.decompose does not re-run it
    decomposed_by: str = ""


NO_ANNOTATIONS = GraphAnnotations()
_KEY = "kiln_annotations"  # the one gm.meta entry kiln's stages share

# node.meta keys more than one stage reads: torch's fake value and capture's TensorSpec (printer.py)
# "stack_trace" is FX's own: the user source line a node came from (capture writes it, reports read it)
# "kiln_checkpoint": the torch.utils.checkpoint region a node was traced in (capture writes it on torch
# nodes, kiln.autograd copies it to their ATen nodes and recomputes them in the backward)
CHECKPOINT_TAG = "kiln_checkpoint"
NODE_META_KEYS = frozenset({"val", "spec", "stack_trace", CHECKPOINT_TAG})
GRAPH_META_KEYS = frozenset({_KEY})


def annotations_of(gm: fx.GraphModule) -> GraphAnnotations:
    """``gm``'s annotations (``NO_ANNOTATIONS`` when no stage annotated it)."""
    found = gm.meta.get(_KEY)
    return found if isinstance(found, GraphAnnotations) else NO_ANNOTATIONS


def annotate(gm: fx.GraphModule, annotations: GraphAnnotations) -> None:
    """Set ``gm``'s annotations; they travel with ``gm.meta`` when a pass copies it to a new graph."""
    if not isinstance(annotations, GraphAnnotations):
        raise TypeError(f"annotate: expected GraphAnnotations, got {type(annotations).__name__}")
    gm.meta[_KEY] = annotations
