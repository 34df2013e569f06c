"""torch.compiler's controls, honoured (functions marked through torch.compiler) and mirrored
(kiln.capture.disable / allow_in_graph / is_compiling / set_stance / mark_static)."""

import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder


def _check(fn, *args, calls=3):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec)
    for i in range(calls):
        torch.manual_seed(i)
        fresh = [torch.randn_like(a) if isinstance(a, torch.Tensor) else a for a in args]
        torch.testing.assert_close(opt(*fresh), fn(*fresh))
    return rec


@pytest.mark.parametrize("disable", [kc.disable, torch.compiler.disable])
def test_disabled_callee_runs_opaque(disable):
    seen = []

    @disable
    def helper(t):
        seen.append(torch.compiler.is_compiling() or kc.is_compiling())
        return t.sin() * 2

    def f(x):
        return helper(x + 1) - 1
    rec = _check(f, torch.randn(4))
    assert rec.count == 2 and seen and not any(seen)  # called for real, never traced
    ex = kc.explain(f)(torch.randn(4))
    assert ex.break_count == 1 and "disable" in ex.break_reasons[0].reason, ex.as_text()


@pytest.mark.parametrize("disable", [kc.disable, torch.compiler.disable])
def test_disabled_non_recursive(disable):
    def inner(t):
        return t * 3

    @disable(recursive=False)
    def helper(t):
        return inner(t) + 1

    def f(x):
        return helper(x).cos()
    _check(f, torch.randn(4))
    assert kc.explain(f)(torch.randn(4)).break_count == 1


def test_disabled_top_level_runs_eagerly_and_explain_says_so():
    @kc.disable(reason="user said so")
    def f(x):
        return x + 1
    rec = _check(f, torch.randn(3))
    assert rec.count == 0
    ex = kc.explain(f)(torch.randn(3))
    assert ex.graph_count == 0 and ex.eager_frames and "user said so" in ex.eager_frames[0].reason


def test_disabled_module_forward():
    class Noisy(torch.nn.Module):
        @torch.compiler.disable
        def forward(self, t):
            return t.relu()

    m = Noisy()

    def f(x):
        return m(x * 2) + 1
    rec = _check(f, torch.randn(5))
    assert rec.count == 2


@pytest.mark.parametrize("allow", [kc.allow_in_graph])
def test_allow_in_graph_is_one_node(allow):
    def opaque(t):
        print("kiln-test: would break if traced")
        return t * 2 + 1
    allow(opaque)

    def f(x):
        return opaque(x.sin()).cos()
    rec = _check(f, torch.randn(4))
    assert rec.count == 1
    targets = [n.target for n in rec.graphs[0].graph.nodes if n.op == "call_function"]
    assert opaque in targets


@pytest.mark.parametrize("is_compiling", [kc.is_compiling, torch.compiler.is_compiling])
def test_is_compiling_true_while_tracing(is_compiling):
    def f(x):
        return x + 1 if is_compiling() else x - 1
    kc.reset()
    x = torch.randn(3)
    opt = kc.optimize(f, Recorder())
    for _ in range(3):
        torch.testing.assert_close(opt(x), x + 1)
    assert not is_compiling()
    torch.testing.assert_close(f(x), x - 1)


def test_stance_force_eager_and_default():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(lambda x: x * 2, rec)
    x = torch.randn(3)
    with kc.set_stance("force_eager"):
        torch.testing.assert_close(opt(x), x * 2)
    assert rec.count == 0
    torch.testing.assert_close(opt(x), x * 2)
    assert rec.count == 1


def test_kiln_stance_is_honoured():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(lambda x: x * 2, rec)
    x = torch.randn(3)
    with kc.set_stance("force_eager"):
        torch.testing.assert_close(opt(x), x * 2)
    assert rec.count == 0
    opt(x)
    assert rec.count == 1


def test_stance_fail_and_eager_on_recompile():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(lambda x: x * 2, rec, dynamic=False)
    opt(torch.randn(3))
    with kc.set_stance("fail_on_recompile"):
        opt(torch.randn(3))  # a hit is fine
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            opt(torch.randn(5))
    with kc.set_stance("eager_on_recompile"):
        y = torch.randn(7)
        torch.testing.assert_close(opt(y), y * 2)
    assert rec.count == 1
    opt(torch.randn(7))
    assert rec.count == 2


def test_stance_eager_then_compile_and_decorator():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(lambda x: x * 2, rec)

    @kc.set_stance("eager_then_compile")
    def run(x):
        return opt(x)
    x = torch.randn(3)
    run(x)
    assert rec.count == 0
    run(x)
    assert rec.count == 1
    with pytest.raises(ValueError, match="unknown stance"):
        kc.set_stance("sometimes")


def test_set_stance_inside_compiled_code_breaks():
    def f(x):
        kc.set_stance("default")
        return x + 1
    assert kc.explain(f)(torch.randn(2)).break_count == 1


def test_mark_static_keeps_dims_static():
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(lambda x: x.sum(0), rec, dynamic=True)
    x = torch.randn(3, 4)
    kc.mark_static(x, 0)
    opt(x)
    shape = next(n for n in rec.graphs[0].graph.nodes if n.op == "placeholder").meta["val"].shape
    assert shape[0] == 3 and isinstance(shape[0], int) and not isinstance(shape[1], int)

