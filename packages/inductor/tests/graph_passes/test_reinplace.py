"""Input mutations by index_put run in place when kiln.autograd marks them (graph_passes/reinplace.py)."""

from __future__ import annotations

import torch
from torch import fx

from kiln.graph import GraphAnnotations, annotate
from kiln.inductor import compile_graph

aten = torch.ops.aten


def _cache_update(extra_reader: bool) -> fx.GraphModule:
    g = fx.Graph()
    cache, pos, row = g.placeholder("cache"), g.placeholder("pos"), g.placeholder("row")
    new = g.call_function(aten.index_put.default, (cache, [None, pos], row))
    out = g.call_function(aten.sum.dim_IntList, (new, [1]))
    if extra_reader:  # the old cache is read too: updating it in place would change that read
        out = g.call_function(aten.add.Tensor, (out, g.call_function(aten.sum.dim_IntList, (cache, [1]))))
    g.output((out, new))
    gm = fx.GraphModule({}, g)
    annotate(gm, GraphAnnotations(input_mutations=((1, 0),)))  # output 1 is the new value of input 0
    return gm


def _inputs() -> list[torch.Tensor]:
    return [torch.zeros(3, 8), torch.tensor([2]), torch.arange(3.0).view(3, 1)]


def test_marked_index_put_updates_the_input_in_place() -> None:
    cache, pos, row = _inputs()
    compiled = compile_graph(_cache_update(False), [cache, pos, row])
    code = compiled.texts["output_code"]
    assert "aten.index_put_.default" not in code and "index_put" in code  # a generated scatter, in place
    out, new = compiled.fn(cache, pos, row)
    assert new.data_ptr() == cache.data_ptr()  # the caller's write-back finds nothing to copy
    expected = torch.zeros(3, 8)
    expected[:, 2] = torch.arange(3.0)
    torch.testing.assert_close(cache, expected)
    torch.testing.assert_close(out, expected.sum(1))


def test_an_input_read_elsewhere_is_not_updated_in_place() -> None:
    cache, pos, row = _inputs()
    compiled = compile_graph(_cache_update(True), [cache, pos, row])
    assert "aten.index_put_.default" not in compiled.texts["output_code"]
    out, new = compiled.fn(cache, pos, row)
    assert torch.count_nonzero(cache) == 0 and new.data_ptr() != cache.data_ptr()
