"""Guard errors on loaded functions name the input, the expected and the actual value."""

from __future__ import annotations

import pytest
import sympy
import torch
from runtime_testlib import MATMUL

from kiln.graph import Guard, GuardSet, PortableProgram, TensorSpec, global_state
from kiln.runtime import GuardError, load_compiled_function, save_artifact


def _saved(tmp_path, w, x, **kwargs):
    path = tmp_path / "mm.kiln"
    save_artifact(path, PortableProgram(MATMUL), input_names=["w", "x"],
                  input_specs=[TensorSpec.from_tensor(w), TensorSpec.from_tensor(x)], **kwargs)
    return load_compiled_function(path)


def test_shape_error_message(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    fn = _saved(tmp_path, w, x)
    torch.testing.assert_close(fn(w, x)[0], x @ w)
    with pytest.raises(GuardError) as e:
        fn(w, torch.randn(4, 9))
    assert str(e.value) == "input 'x': expected shape (4, 8), got (4, 9)"
    assert (e.value.input_name, e.value.expected, e.value.actual) == ("x", "(4, 8)", "(4, 9)")


@pytest.mark.parametrize("bad, message", [
    (lambda x: x.double(), "input 'x': expected dtype float32, got float64"),
    (lambda x: x.to("meta"), "input 'x': expected device cpu, got meta"),
    (lambda x: x.t().contiguous().t(), "input 'x': expected stride (8, 1), got (1, 4)"),
    (lambda x: x.clone().requires_grad_(), "input 'x': expected requires_grad False, got True"),
    (lambda x: x.tolist(), "input 'x': expected type a tensor, got list"),
])
def test_tensor_mismatch_messages(tmp_path, bad, message):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    fn = _saved(tmp_path, w, x)
    with pytest.raises(GuardError) as e:
        fn(w, bad(x))
    assert str(e.value) == message


def test_disable_guard_check(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    fn = _saved(tmp_path, w, x)
    big = torch.randn(6, 8)
    with pytest.raises(GuardError):
        fn(w, big)
    fn.disable_guard_check()
    torch.testing.assert_close(fn(w, big)[0], big @ w)  # the program itself is shape-generic
    fn.enable_guard_check()
    with pytest.raises(GuardError):
        fn(w, big)


def test_dynamic_dims_and_symbol_relations(tmp_path):
    s0 = sympy.Symbol("s0")
    w = torch.randn(8, 3)
    x_spec = TensorSpec((s0, 8), torch.float32, torch.device("cpu"), (8, 1))
    guards = GuardSet((Guard("L['x'].size()[0]", "SYMBOL", "s0"), Guard("L['y'].size()[0]", "SYMBOL", "s0"),
                       Guard("", "SHAPE_EXPR", "s0 >= 2")))
    path = tmp_path / "dyn.kiln"
    save_artifact(path, PortableProgram(MATMUL.replace("w, x = args", "w, x, y = args")),
                  input_names=["w", "x", "y"], guards=guards,
                  input_specs=[TensorSpec.from_tensor(w), x_spec, x_spec])
    fn = load_compiled_function(path)
    for n in (2, 5, 7):  # any batch size that satisfies the constraints
        x = torch.randn(n, 8)
        torch.testing.assert_close(fn(w, x, torch.randn(n, 8))[0], x @ w)
    with pytest.raises(GuardError, match=r"input 'y': expected size of dim 0 5 \(the same value s0 as an earlier size\), got 6"):
        fn(w, torch.randn(5, 8), torch.randn(6, 8))
    with pytest.raises(GuardError, match=r"input 'x' dim 0: size 1 is outside the range \[2, inf\]"):
        fn(w, torch.randn(1, 8), torch.randn(1, 8))
    with pytest.raises(GuardError, match=r"input 'x': expected shape \(\*, 8\), got \(3, 9\)"):
        fn(w, torch.randn(3, 9), torch.randn(3, 9))


def test_symbolic_strides_are_checked(tmp_path):
    """A dynamic input's stride bound to a size symbol (a contiguous [s0, s1] has stride s1): a
    transposed input of the same sizes is refused, not read as if contiguous."""
    s0, s1 = sympy.Symbol("s0"), sympy.Symbol("s1")
    w = torch.randn(8, 3)
    x_spec = TensorSpec((s0, s1), torch.float32, torch.device("cpu"), (s1, 1))
    guards = GuardSet((Guard("L['x'].size()[0]", "SYMBOL", "s0"), Guard("L['x'].size()[1]", "SYMBOL", "s1"),
                       Guard("L['x'].stride()[0]", "SYMBOL", "s1"),
                       Guard("L['x']", "TENSOR_MATCH", ("torch.float32", "cpu", (None, None), (None, 1), False))))
    path = tmp_path / "dyn.kiln"
    save_artifact(path, PortableProgram(MATMUL), input_names=["w", "x"], guards=guards,
                  input_specs=[TensorSpec.from_tensor(w), x_spec])
    fn = load_compiled_function(path)
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(w, x)[0], x @ w)
    with pytest.raises(GuardError, match=r"input 'x': expected stride of dim 0 8 \(the same value s1"):
        fn(w, torch.randn(4, 16)[:, :8])
    with pytest.raises(GuardError):
        fn(w, torch.randn(8, 4).t())


def test_value_guards_on_python_arguments(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    guards = [Guard("L['n']", "EQUALS_MATCH", 3), Guard("L['opts']", "DICT_KEYS", ("a",)),
              Guard("L['items']", "LENGTH_MATCH", 2), Guard("L['maybe']", "IS_NONE", None)]
    path = tmp_path / "v.kiln"
    save_artifact(path, PortableProgram(MATMUL), input_sources=["L['w']", "L['x']"],
                  input_specs=[TensorSpec.from_tensor(w), TensorSpec.from_tensor(x)], guards=guards)
    # without a frame, the parameters are the inputs' roots, then the guards' roots
    fn = load_compiled_function(path)
    assert [p.name for p in fn.artifact.manifest.params] == ["w", "x", "n", "opts", "items", "maybe"]
    good = dict(n=3, opts={"a": 1}, items=[1, 2], maybe=None)
    torch.testing.assert_close(fn(w, x, **good)[0], x @ w)
    for change, message in [({"n": 4}, "input 'n': expected value 3, got 4"),
                            ({"opts": {"b": 1}}, "input 'opts': expected keys ['a'], got ['b']"),
                            ({"items": [1]}, "input 'items': expected length 2, got 1"),
                            ({"maybe": 1}, "input 'maybe': expected value None, got int")]:
        with pytest.raises(GuardError) as e:
            fn(w, x, **{**good, **change})
        assert str(e.value) == message
    with pytest.raises(TypeError, match="missing a required argument: 'maybe'"):
        fn(w, x, 3, {"a": 1}, [1, 2])


def test_global_state_guard(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    fn = _saved(tmp_path, w, x, guards=[Guard("", "GLOBAL_STATE", global_state())])
    fn(w, x)
    with torch.no_grad(), pytest.raises(GuardError) as e:
        fn(w, x)
    assert str(e.value).startswith("global state grad_enabled: expected True, got False")


def test_guard_on_unreadable_source(tmp_path):
    model = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8)
    path = tmp_path / "m.kiln"
    save_artifact(path, PortableProgram(MATMUL), input_sources=["L['self'].weight", "L['x']"],
                  input_specs=[TensorSpec.from_tensor(model.weight.t()), TensorSpec.from_tensor(x)],
                  guards=[Guard("L['self']", "TYPE_MATCH", "torch.nn.modules.linear:Linear")])
    fn = load_compiled_function(path)
    fn.disable_guard_check()
    with pytest.raises(GuardError, match=r"input 'self.weight': cannot read L\['self'\]\.weight"):
        fn(object(), x)
    fn.enable_guard_check()
    with pytest.raises(GuardError, match="input 'self': expected type torch.nn.modules.linear.Linear, "
                                         "got builtins.object"):
        fn(object(), x)


def test_dtype_and_device_values_survive_the_round_trip(tmp_path):
    w, x = torch.randn(8, 3), torch.randn(4, 8)
    guards = [Guard("L['dtype']", "EQUALS_MATCH", torch.float32),
              Guard("L['device']", "EQUALS_MATCH", torch.device("cpu"))]
    path = tmp_path / "d.kiln"
    save_artifact(path, PortableProgram(MATMUL), input_sources=["L['w']", "L['x']"], guards=guards)
    fn = load_compiled_function(path)
    torch.testing.assert_close(fn(w, x, torch.float32, torch.device("cpu"))[0], x @ w)
    with pytest.raises(GuardError, match="input 'dtype': expected value torch.float32, got torch.float16"):
        fn(w, x, torch.float16, torch.device("cpu"))


def test_guard_values_that_are_not_data_are_refused(tmp_path):
    from kiln.runtime import ArtifactError

    with pytest.raises(ArtifactError, match="cannot be saved: its expected value, a frozenset"):
        save_artifact(tmp_path / "x.kiln", PortableProgram(MATMUL), input_sources=["L['w']", "L['x']"],
                      guards=[Guard("L['s']", "EQUALS_MATCH", frozenset({1}))])
