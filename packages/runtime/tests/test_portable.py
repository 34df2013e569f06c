"""FX graphs as portable source: saved, loaded and run without the graph objects."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from runtime_testlib import apply_twice
from torch import fx

from kiln.graph import TensorSpec
from kiln.runtime import ArtifactError, load_compiled_function, save_artifact
from kiln.runtime.portable import graph_module_source, program_from_graph_module


def _aten_graph() -> fx.GraphModule:
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    c = g.get_attr("sub.const")
    mm = g.call_function(torch.ops.aten.mm.default, (x, w))
    a = g.call_function(torch.ops.aten.add.Tensor, (mm, c))
    first = g.call_function(operator.getitem, (g.call_function(torch.ops.aten.split.Tensor, (a, 2)), 0))
    full = g.call_function(torch.ops.aten.full.default, ([2, 3], float("inf")),
                           {"dtype": torch.float32, "device": torch.device("cpu")})
    g.output((first, full, a))
    root = torch.nn.Module()
    root.sub = torch.nn.Module()
    root.sub.const = torch.randn(3)
    return fx.GraphModule(root, g)


def _round_trip(tmp_path, gm, *args):
    save_artifact(tmp_path / "g.kiln", program_from_graph_module(gm),
                  input_names=[f"a{i}" for i in range(len(args))],
                  input_specs=[TensorSpec.from_tensor(a) for a in args], backend="eager")
    return load_compiled_function(tmp_path / "g.kiln")


def test_aten_graph_with_constants(tmp_path):
    gm = _aten_graph()
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    fn = _round_trip(tmp_path, gm, x, w)
    for got, want in zip(fn(x, w), gm(x, w), strict=True):
        torch.testing.assert_close(got, want)
    assert "torch.ops.aten.mm.default" in fn.artifact.source  # readable generated code


def test_torch_dialect_graph(tmp_path):
    def f(x, y):
        z = F.gelu(x @ y) + torch.relu(y).sum()
        return (z.view(-1).softmax(0), z.shape[0] * 2.0)

    gm = fx.symbolic_trace(f)
    x, y = torch.randn(3, 4), torch.randn(4, 4)
    fn = _round_trip(tmp_path, gm, x, y)
    got, want = fn(x, y), f(x, y)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]


def test_nested_graph_module_and_module_level_function(tmp_path):
    inner_g = fx.Graph()
    t = inner_g.placeholder("t")
    inner_g.output((inner_g.call_function(torch.ops.aten.mul.Tensor, (t, 3.0)),))
    root = torch.nn.Module()
    root.body = fx.GraphModule(torch.nn.Module(), inner_g)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(apply_twice, (g.get_attr("body"), x)),))
    gm = fx.GraphModule(root, g)
    x = torch.randn(5)
    fn = _round_trip(tmp_path, gm, x)
    torch.testing.assert_close(fn(x)[0], x * 9)


def test_two_graphs_share_one_module():
    src_a, files_a = graph_module_source(_aten_graph(), "fw", "fw/")
    src_b, files_b = graph_module_source(_aten_graph(), "bw", "bw/")
    ns = {"FILES": {**files_a, **files_b}}
    exec(compile(src_a + "\n" + src_b, "<two graphs>", "exec"), ns)
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    assert ns["fw"](x, w)[2].shape == ns["bw"](x, w)[2].shape == (4, 3)
    assert set(files_a) == {"fw/fw.constants.safetensors"}


def test_unportable_graphs_are_refused():
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))  # keeps a call_module
    with pytest.raises(ArtifactError, match="calls submodule"):
        program_from_graph_module(gm)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(lambda t: t + 1, (x,)),))
    with pytest.raises(ArtifactError, match="cannot be saved as source"):
        program_from_graph_module(fx.GraphModule(torch.nn.Module(), g))
