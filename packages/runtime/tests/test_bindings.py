"""Where graph inputs come from after a load: arguments, external_data, saved constants, f_globals."""

from __future__ import annotations

import pytest
import torch

from kiln.graph import Guard, PortableProgram, TensorSpec
from kiln.runtime import ArtifactError, CallFrame, GuardError, load_compiled_function, save_artifact

LINEAR = '''
import torch
aten = torch.ops.aten

def call(args):
    w, b, x = args
    return (aten.addmm(b, x, aten.t(w)),)
'''

GLOBAL_W = torch.randn(8, 3)


def _specs(*ts):
    return [TensorSpec.from_tensor(t) for t in ts]


def test_module_forward_convention(tmp_path):
    """``compiled(model, x)``: a module's forward takes the module as its first argument."""
    model, x = torch.nn.Linear(8, 3), torch.randn(4, 8)
    frame = CallFrame.of(model.forward, (x,))
    assert [p.name for p in frame.params] == ["self", "input"]
    save_artifact(tmp_path / "m.kiln", PortableProgram(LINEAR), frame=frame,
                  input_sources=["L['self'].weight", "L['self'].bias", "L['input']"],
                  input_specs=_specs(model.weight, model.bias, x))
    fn = load_compiled_function(tmp_path / "m.kiln")
    other = torch.nn.Linear(8, 3)
    torch.testing.assert_close(fn(other, x)[0], other(x))
    torch.testing.assert_close(fn(model, input=x)[0], model(x))
    assert [b.kind for b in fn.artifact.manifest.bindings] == ["argument", "argument"]


def test_closure_module_goes_through_external_data(tmp_path):
    model, x = torch.nn.Linear(8, 3), torch.randn(4, 8)

    def f(x):
        return model(x)

    kwargs = dict(frame=CallFrame.of(f, (x,)), input_specs=_specs(model.weight, model.bias, x),
                  input_sources=["L['model'].weight", "L['model'].bias", "L['x']"],
                  guards=[Guard("L['model'].training", "EQUALS_MATCH", True)])
    with pytest.raises(ArtifactError, match=r"external_data=\{'model': <the module>\}"):
        save_artifact(tmp_path / "f.kiln", PortableProgram(LINEAR), **kwargs)
    save_artifact(tmp_path / "f.kiln", PortableProgram(LINEAR), external_data={"net": model}, **kwargs)
    with pytest.raises(ArtifactError, match=r"needs external data .*'net' \(for L\['model'\]\)"):
        load_compiled_function(tmp_path / "f.kiln")
    other = torch.nn.Linear(8, 3)
    fn = load_compiled_function(tmp_path / "f.kiln", external_data={"net": other})
    torch.testing.assert_close(fn(x)[0], other(x))
    with torch.no_grad():  # the live module is read on every call: updates are seen
        other.weight.add_(1.0)
    torch.testing.assert_close(fn(x)[0], other(x))
    other.eval()  # guards on the external object are re-checked
    with pytest.raises(GuardError, match="input 'model.training': expected value True, got False"):
        fn(x)


def test_external_data_matches_a_submodule(tmp_path):
    outer = torch.nn.Sequential(torch.nn.Linear(8, 3))
    x = torch.randn(2, 8)

    def f(x):
        return outer(x)

    save_artifact(tmp_path / "s.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (x,)),
                  external_data={"lin": outer[0]}, input_specs=_specs(outer[0].weight, outer[0].bias, x),
                  input_sources=["L['outer'][0].weight", "L['outer'][0].bias", "L['x']"])
    fn = load_compiled_function(tmp_path / "s.kiln", external_data={"lin": outer[0]})
    assert fn.artifact.manifest.bindings[0].prefix == "L['outer'][0]"
    torch.testing.assert_close(fn(x)[0], outer(x))


def test_closure_tensor_is_saved_as_a_constant(tmp_path):
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(4, 8)

    def f(x):
        return x @ w.t() + b

    save_artifact(tmp_path / "c.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (x,)),
                  input_sources=["L['w']", "L['b']", "L['x']"], input_specs=_specs(w, b, x),
                  guards=[Guard("L['w']", "TENSOR_MATCH", ("torch.float32", "cpu", (3, 8), (8, 1), False))])
    fn = load_compiled_function(tmp_path / "c.kiln")
    assert [b.kind for b in fn.artifact.manifest.bindings] == ["constant", "constant", "argument"]
    want = f(x)
    w.mul_(0)  # the artifact froze the closure's values at save time
    torch.testing.assert_close(fn(x)[0], want)
    assert len(fn.guards) == 1  # only the guard on x: guards on saved constants check nothing


def test_global_tensor_saved_or_read_from_f_globals(tmp_path):
    b, x = torch.zeros(3), torch.randn(4, 8)

    def f(x):
        return x @ GLOBAL_W + b

    save_artifact(tmp_path / "g.kiln", PortableProgram(LINEAR.replace("aten.t(w)", "w")),
                  frame=CallFrame.of(f, (x,)), input_sources=["G['GLOBAL_W']", "L['b']", "L['x']"],
                  input_specs=_specs(GLOBAL_W, b, x))
    saved = load_compiled_function(tmp_path / "g.kiln")
    torch.testing.assert_close(saved(x)[0], x @ GLOBAL_W)
    live_w = torch.randn(8, 3)
    live = load_compiled_function(tmp_path / "g.kiln", f_globals={"GLOBAL_W": live_w})
    torch.testing.assert_close(live(x)[0], x @ live_w)
    scope = {"GLOBAL_W": torch.randn(8, 4)}
    with pytest.raises(GuardError, match=r"input 'GLOBAL_W': expected shape \(8, 3\), got \(8, 4\)"):
        load_compiled_function(tmp_path / "g.kiln", f_globals=scope)(x)


def test_defaults_and_keyword_only_parameters(tmp_path):
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(4, 8)

    def f(w, b, x, *, scale=2.0, mode=None):
        return x @ w.t() + b

    save_artifact(tmp_path / "k.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (w, b, x)),
                  input_sources=["L['w']", "L['b']", "L['x']"], input_specs=_specs(w, b, x),
                  guards=[Guard("L['scale']", "EQUALS_MATCH", 2.0), Guard("L['mode']", "IS_NONE", None)])
    fn = load_compiled_function(tmp_path / "k.kiln")
    torch.testing.assert_close(fn(w, b, x)[0], f(w, b, x))
    torch.testing.assert_close(fn(w, b, x, scale=2.0)[0], f(w, b, x))
    with pytest.raises(GuardError, match="input 'scale': expected value 2.0, got 3.0"):
        fn(w, b, x, scale=3.0)
    with pytest.raises(TypeError):
        fn(w, b, x, 2.0)  # keyword-only stays keyword-only


def test_unsaveable_input_is_refused_at_save(tmp_path):
    x = torch.randn(2, 8)
    thing = object()

    def f(x):
        return thing

    with pytest.raises(ArtifactError, match="neither a tensor nor a number"):
        save_artifact(tmp_path / "u.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (x,)),
                      input_sources=["L['thing']", "L['x']"])


def test_closure_parameter_constant_stays_a_trainable_leaf(tmp_path):
    w = torch.nn.Parameter(torch.randn(3, 8))
    b, x = torch.zeros(3), torch.randn(4, 8)

    def f(x):
        return x @ w.t() + b

    save_artifact(tmp_path / "p.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (x,)),
                  input_sources=["L['w']", "L['b']", "L['x']"], input_specs=_specs(w, b, x))
    fn = load_compiled_function(tmp_path / "p.kiln")
    fn(x)[0].sum().backward()
    saved_w = fn.plan.static["<constant:c0>"]
    assert saved_w.requires_grad and saved_w.is_leaf
    torch.testing.assert_close(saved_w.grad, x.sum(0).expand(3, 8))


def test_resaving_a_loaded_artifact_with_constants_keeps_it_intact(tmp_path):
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(4, 8)
    n = 3

    def f(x):
        return x @ w.t() + b * n

    save_artifact(tmp_path / "c.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (x,)),
                  input_sources=["L['w']", "L['b']", "L['x']"], input_specs=_specs(w, b, x))
    fn = load_compiled_function(tmp_path / "c.kiln")
    fn.save_compiled_function(tmp_path / "again.kiln")
    again = load_compiled_function(tmp_path / "again.kiln")
    assert again.artifact.manifest.integrity == fn.artifact.manifest.integrity
    torch.testing.assert_close(again(x)[0], fn(x)[0])


def test_guards_under_identity_bindings_are_not_rewritten_one_by_one(tmp_path, monkeypatch):
    """A load looks up a rewrite only for guards under a binding it rewrites (external data here);
    guards on the arguments keep their source as it is, without a lookup each."""
    from kiln.runtime.bindings import Resolver

    model, x = torch.nn.Linear(8, 3), torch.randn(4, 8)

    def f(m, x):
        return model(x) + m.weight.sum()

    guards = [Guard("L['model'].training", "EQUALS_MATCH", True),
              *(Guard(f"L['m'].attr{i}", "EQUALS_MATCH", i) for i in range(20))]
    m = torch.nn.Linear(8, 3)
    for i in range(20):
        setattr(m, f"attr{i}", i)
    save_artifact(tmp_path / "f.kiln", PortableProgram(LINEAR), frame=CallFrame.of(f, (m, x)),
                  external_data={"net": model}, guards=guards,
                  input_specs=_specs(model.weight, model.bias, x),
                  input_sources=["L['model'].weight", "L['model'].bias", "L['x']"])
    looked_up: list[str] = []
    real = Resolver.guard_expr

    def counting(self, source):
        looked_up.append(source)
        return real(self, source)
    monkeypatch.setattr(Resolver, "guard_expr", counting)
    fn = load_compiled_function(tmp_path / "f.kiln", external_data={"net": model})
    assert sorted(looked_up) == ["L['model'].bias", "L['model'].training", "L['model'].weight"]
    torch.testing.assert_close(fn(m, x)[0], model(x))
    m.attr3 = 4  # a guard on an argument still checks
    with pytest.raises(GuardError, match="attr3"):
        fn(m, x)
    model.eval()  # and the rewritten one on the external object
    m.attr3 = 3
    with pytest.raises(GuardError, match="model.training"):
        fn(m, x)
