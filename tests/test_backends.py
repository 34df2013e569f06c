"""The backends registry and the errors of missing stages."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.backends import resolve_backend
from kiln.settings import CompileOptions


def test_builtin_backends_are_listed() -> None:
    names = kiln.list_backends()
    assert {"eager", "aot_eager", "inductor"} <= set(names)


def test_register_backend_by_decorator() -> None:
    @kiln.register_backend(name="kiln_test_identity")
    def identity(gm, example_inputs):
        return gm.forward

    assert "kiln_test_identity" in kiln.list_backends()
    assert callable(resolve_backend("kiln_test_identity", CompileOptions()))


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        resolve_backend("nope", CompileOptions())


def test_unknown_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        CompileOptions(mode="fastest")


@pytest.mark.parametrize(("options", "named"), [({"cudagraph_max_recordings": -1}, "cudagraph_max_recordings"),
                                              ({"wrapper": "rust"}, "wrapper")])
def test_bad_inductor_options_are_a_clear_error(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        resolve_backend("inductor", CompileOptions(mode="reduce-overhead", options=options))


@pytest.mark.parametrize(("named", "on_gpu", "cudagraphs", "wrapper", "refused"), [
    (None, True, False, "tiered", False),  # a CUDA graph in default mode, inference or training: tiered
    (None, False, False, "tiered", False),  # CPU graphs, inference and training: tiered by default
    (None, True, True, "python", False),  # CUDA graphs replay reduce-overhead graphs
    ("python", True, False, "python", False),  # the options' choice wins
    ("cpp", False, False, "cpp", False),
    ("cpp", True, True, "python", True),  # refused where CUDA graphs replay it, said why
])
def test_the_wrapper_of_each_graph(named, on_gpu, cudagraphs, wrapper, refused) -> None:
    from kiln.backends import graph_wrapper

    got, why = graph_wrapper(named, "tiered", on_gpu=on_gpu, cudagraphs=cudagraphs, cpu_default="tiered")
    assert got == wrapper and (why is not None) == refused


def test_builtin_names_cannot_be_replaced() -> None:
    with pytest.raises(ValueError, match="built-in"):
        kiln.register_backend(lambda gm, ex: gm.forward, name="eager")


def test_module_parameters_and_buffers_are_marked_static_for_cuda_graphs() -> None:
    """reduce-overhead copies every non-static input into its graph's slot on each call: the
    parameters and buffers must be recognised, or a decode step copies all its weights."""
    import torch

    from kiln.graph import annotations_of

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    marks: dict[str, bool] = {}

    def record(gm, example_inputs):
        static = annotations_of(gm).module_state
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        marks.update({n.name: i in static for i, n in enumerate(placeholders)})
        return gm.forward

    kiln.compile(model, backend=record)(torch.randn(2, 4))
    assert sum(marks.values()) == 6, marks  # weight, bias, BN weight/bias/running stats
    assert sum(not static for static in marks.values()) == 1, marks  # the input x


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_torch_cond_is_one_graph_through_every_backend(backend: str) -> None:
    """kiln.capture records torch.cond as a subgraph op; kiln.autograd traces both branches."""
    import torch

    def f(x, w):
        return torch.cond(x.sum() > 0, lambda x: (x * w).sin(), lambda x: (x - w).cos(), (x,)) + 1

    w = torch.randn(8, requires_grad=True)
    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    for x in (torch.randn(8).abs(), -torch.randn(8).abs()):
        out, ref = compiled(x, w), f(x, w)
        (got,) = torch.autograd.grad(out.sum(), w)
        (want,) = torch.autograd.grad(ref.sum(), w)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(got, want)


def test_channels_last_training_keeps_saved_activations_and_matches_eager() -> None:
    # conv_layout forced on CPU: the forward's saved activations stay channels-last (kiln.autograd
    # compiles the backward for the strides the forward returns) and gradients match eager
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU()).double()
    ref = copy.deepcopy(net)
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    compiled = kiln.compile(net, backend="inductor", options={"conv_layout": "channels_last"})
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
