"""Guards, recompiles, dynamic shapes, fullgraph errors, explain, capture_graph, exceptions."""

import warnings

import pytest
import torch
from torch import nn

import kiln.capture as kc
from kiln.graph import CapturedGraph, TensorSpec

from .conftest import Recorder, assert_same


def f_add(x, y):
    return x * 2 + y


def test_cache_hit_reuses_entry(recorder):
    g = kc.optimize(f_add, recorder)
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(3)
        assert_same(g(x, y), f_add(x, y))
    assert recorder.count == 1
    entries = kc.cache_entries(g)
    assert len(entries) == 1 and entries[0].hits == 2


@pytest.mark.parametrize("change", ["dtype", "ndim", "requires_grad", "stride"])
def test_tensor_guard_recompiles(recorder, change):
    g = kc.optimize(f_add, recorder, dynamic=False)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    g(x, y)
    if change == "dtype":
        x2, y2 = x.double(), y.double()
    elif change == "ndim":
        x2, y2 = torch.randn(4, 4, 1), torch.randn(4, 4, 1)
    elif change == "requires_grad":
        x2, y2 = x.clone().requires_grad_(), y
    else:
        x2, y2 = torch.randn(4, 4).t(), y
    assert_same(g(x2, y2), f_add(x2, y2))
    assert recorder.count == 2
    assert kc.recompile_count(g) == 1


def test_recompile_reason_logged(recorder, caplog):
    from kiln.graph import set_logs

    set_logs("recompiles")
    try:
        import logging
        logging.getLogger("kiln.recompiles").propagate = True
        with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            g = kc.optimize(f_add, recorder, dynamic=False)
            g(torch.randn(2), torch.randn(2))
            g(torch.randn(2).double(), torch.randn(2).double())
        text = caplog.text
        assert "TENSOR_MATCH L['x']" in text and "float64" in text and "expected" in text
    finally:
        set_logs()


def test_constant_argument_specialises(recorder):
    def f(x, n):
        return x * n
    g = kc.optimize(f, recorder)
    x = torch.randn(3)
    assert_same(g(x, 2), f(x, 2))
    assert_same(g(x, 2), f(x, 2))
    assert_same(g(x, 3), f(x, 3))
    assert recorder.count == 2


def test_recompile_limit_falls_back_with_warning(recorder):
    def f(x, n):
        return x + n
    g = kc.optimize(f, recorder, recompile_limit=2)
    x = torch.randn(2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(5):
            assert_same(g(x, n), f(x, n))
    assert recorder.count == 2
    assert any("recompile limit" in str(m.message) for m in w)


def test_module_guard_on_identity(recorder):
    m1, m2 = nn.Linear(3, 3), nn.Linear(3, 3)

    def f(m, x):
        return m(x)
    g = kc.optimize(f, recorder)
    x = torch.randn(2, 3)
    assert_same(g(m1, x), m1(x))
    assert_same(g(m2, x), m2(x))
    assert_same(g(m1, x), m1(x))
    assert recorder.count == 2


def test_parameters_are_placeholders_with_sources(recorder):
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    g = kc.optimize(m.forward, recorder)
    x = torch.randn(2, 3)
    assert_same(g(x), m(x))
    gm = recorder.graphs[0]
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = [n.meta["source"] for n in ph]
    assert sources[0] == "L['input']"
    assert "L['self'][0].weight" in sources or "L['self']._modules['0'].weight" in sources or \
        any(s.endswith(".weight") for s in sources)
    assert all(isinstance(n.meta["spec"], TensorSpec) for n in ph)
    assert all(isinstance(n.meta["val"], torch.Tensor) for n in ph)
    assert len(recorder.inputs[0]) == len(ph)
    assert recorder.inputs[0][1] is m[0].weight


def test_parameter_update_in_place_is_seen(recorder):
    m = nn.Linear(3, 3)
    g = kc.optimize(m.forward, recorder)
    x = torch.randn(2, 3)
    g(x)
    with torch.no_grad():
        m.weight.add_(1.0)
    assert_same(g(x), m(x))
    assert recorder.count == 1


def test_global_change_recompiles(recorder):
    global SCALE_G
    SCALE_G = 2

    def f(x):
        return x * SCALE_G
    g = kc.optimize(f, recorder)
    x = torch.randn(3)
    assert_same(g(x), x * 2)
    SCALE_G = 5
    assert_same(g(x), x * 5)
    assert recorder.count == 2


def test_closure_change_recompiles(recorder):
    def make(k):
        def f(x):
            return x * k
        return f
    f = make(3)
    g = kc.optimize(f, recorder)
    x = torch.randn(3)
    assert_same(g(x), x * 3)
    f.__closure__[0].cell_contents = 4
    assert_same(g(x), x * 4)
    assert recorder.count == 2


def test_grad_mode_guard(recorder):
    g = kc.optimize(f_add, recorder)
    x, y = torch.randn(2), torch.randn(2)
    g(x, y)
    with torch.no_grad():
        g(x, y)
    assert recorder.count == 2


def test_list_length_guard(recorder):
    def f(xs):
        return sum(xs)
    g = kc.optimize(f, recorder)
    a = [torch.randn(2) for _ in range(3)]
    assert_same(g(a), f(a))
    assert_same(g(a[:2]), f(a[:2]))
    assert recorder.count == 2


def test_dict_keys_guard(recorder):
    def f(d):
        return d["a"] * 2 + d.get("b", 1)
    g = kc.optimize(f, recorder)
    x = torch.randn(2)
    assert_same(g({"a": x}), f({"a": x}))
    assert_same(g({"a": x, "b": x}), f({"a": x, "b": x}))
    assert recorder.count == 2


# ---- dynamic shapes -------------------------------------------------------------------------
def f_dyn(x):
    b = x.shape[0]
    return x.reshape(b, -1).sum(1) * b


def test_automatic_dynamic_on_second_size(recorder):
    g = kc.optimize(f_dyn, recorder)
    for n in (3, 4, 5, 6):
        x = torch.randn(n, 2, 2)
        assert_same(g(x), f_dyn(x))
    assert recorder.count == 2
    spec = next(n for n in recorder.graphs[1].graph.nodes if n.op == "placeholder").meta["spec"]
    assert not isinstance(spec.shape[0], int) and spec.shape[1:] == (2, 2)


def test_dynamic_true(recorder):
    g = kc.optimize(f_dyn, recorder, dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 2, 2)
        assert_same(g(x), f_dyn(x))
    assert recorder.count == 1


def test_dynamic_false_recompiles_each_size(recorder):
    g = kc.optimize(f_dyn, recorder, dynamic=False)
    for n in (3, 4, 5):
        x = torch.randn(n, 2)
        assert_same(g(x), f_dyn(x))
    assert recorder.count == 3


def test_mark_dynamic(recorder):
    g = kc.optimize(f_dyn, recorder)
    x = torch.randn(4, 3)
    kc.mark_dynamic(x, 0)
    g(x)
    y = torch.randn(7, 3)
    assert_same(g(y), f_dyn(y))
    assert recorder.count == 1


def test_dynamic_size_one_is_served_by_the_symbolic_graph(recorder):
    """A size traced at >= 2 has the range [1, inf): size 1 runs the same graph, since nothing in f_dyn
    asks whether it is 1 (tests/test_dynamic_size_one_range.py has programs that do, and get a guard)."""
    g = kc.optimize(f_dyn, recorder, dynamic=True)
    for n in (5, 1, 3, 1):
        x = torch.randn(n, 2)
        assert_same(g(x), f_dyn(x))
    assert recorder.count == 1


def test_dynamic_shape_guard_relation(recorder):
    def f(x, y):
        return x + y
    g = kc.optimize(f, recorder, dynamic=True)
    g(torch.randn(4), torch.randn(4))
    assert_same(g(torch.randn(6), torch.randn(6)), None) if False else None
    a, b = torch.randn(6), torch.randn(6)
    assert_same(g(a, b), a + b)
    assert recorder.count == 1


# ---- fullgraph, explain, capture_graph ----------------------------------------------------------
def f_breaks(x):
    y = x + 1
    y.tolist()
    return y * 2


def test_fullgraph_raises_unsupported():
    g = kc.optimize(f_breaks, Recorder(), fullgraph=True)
    with pytest.raises(kc.Unsupported) as e:
        g(torch.randn(2))
    msg = str(e.value)
    assert "tolist()" in msg and "test_features.py" in msg and "hint" in msg


def test_fullgraph_data_dependent():
    def f(x):
        if x.sum() > 0:
            return x
        return -x
    with pytest.raises(kc.Unsupported, match="data-dependent"):
        kc.optimize(f, Recorder(), fullgraph=True)(torch.randn(3))


def test_explain_graph_count_matches_backend_calls():
    rec = Recorder()
    x = torch.randn(2)
    kc.optimize(f_breaks, rec)(x)
    assert kc.explain(f_breaks)(x).graph_count == rec.count


def test_explain_counts():
    ex = kc.explain(f_breaks)(torch.randn(2))
    assert ex.graph_count == 2 and ex.break_count == 1
    assert "tolist()" in ex.break_reasons[0].reason
    assert any("test_features.py" in s for s in ex.break_reasons[0].user_stack)
    assert ex.op_count == 2
    assert "Graph count: 2" in ex.as_text()
    assert all(isinstance(g, CapturedGraph) for g in ex.graphs)
    assert len(ex.guards) == 2


def test_capture_graph_whole():
    m = nn.Linear(3, 2)
    cg = kc.capture_graph(m.forward, (torch.randn(4, 3),), {})
    assert isinstance(cg, CapturedGraph)
    assert cg.input_sources[0] == "L['input']"
    assert len(cg.input_sources) == 3
    out = cg.gm(torch.randn(4, 3), m.weight, m.bias)
    assert isinstance(out, tuple) and out[0].shape == (4, 2)
    assert "TENSOR_MATCH" in cg.guards.as_text()
    assert cg.guards.to_json()


def test_capture_graph_refuses_breaks():
    with pytest.raises(kc.Unsupported):
        kc.capture_graph(f_breaks, (torch.randn(2),), {})


# ---- exceptions and eager fallbacks ------------------------------------------------------------
def test_user_exception_surfaces_with_user_traceback(recorder):
    def f(x):
        if x.shape[0] == 3:
            raise ValueError("bad size")
        return x
    g = kc.optimize(f, recorder)
    with pytest.raises(ValueError, match="bad size") as e:
        g(torch.randn(3))
    assert any(tb.name == "f" for tb in e.traceback)


_SUPPRESSED_AFTER_A_BREAK = """
import torch
import kiln.capture as kc

class Suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is ValueError

def f(x):
    with Suppress():
        y = x + 1
        if x.sum() > 0:  # data-dependent: a graph break inside the with block
            raise ValueError
        y = y * 2
    return y

g = kc.optimize(f, lambda gm, inputs: gm)
for sign in (-1.0, 1.0, 1.0, -1.0):
    x = torch.full((3,), sign)
    got, want = g(x), f(x)
    assert torch.equal(got, want), (sign, got, want)
print("same as eager")
"""


def test_an_exception_a_with_block_suppresses_after_a_graph_break():
    """The resume function after a break inside a ``with`` block: an exception the context manager suppresses
    unwinds to the handler's stack depth and returns eager's value (its handlers got the stack analysis's
    "unreachable" depth and the frame too small a stack: the process crashed). In a subprocess, so that a
    crash fails this test only."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _SUPPRESSED_AFTER_A_BREAK],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("same as eager"), run.stderr[-3000:]


def test_runtime_shape_error_surfaces(recorder):
    def f(x, y):
        return x @ y
    g = kc.optimize(f, recorder)
    with pytest.raises(RuntimeError):
        g(torch.randn(2, 3), torch.randn(2, 3))


def test_generator_function_runs_eagerly(recorder):
    def gen(x):
        yield x + 1
        yield x + 2
    g = kc.optimize(gen, recorder)
    out = list(g(torch.ones(2)))
    assert len(out) == 2 and recorder.count == 0


def test_unsupported_c_function_is_a_break(recorder):
    import math

    def f(x):
        y = x + 1
        z = math.fsum(y)  # a C function that needs the data
        return y * z
    g = kc.optimize(f, recorder)
    x = torch.randn(3)
    assert_same(g(x), f(x))
    assert kc.explain(f)(x).break_count >= 1


def test_bound_method_and_callable_object(recorder):
    class C:
        def __init__(self):
            self.k = 2

        def __call__(self, x):
            return x * self.k
    c = C()
    g = kc.optimize(c, recorder)
    x = torch.randn(2)
    assert_same(g(x), c(x))
    g2 = kc.optimize(c.__call__, Recorder())
    assert_same(g2(x), c(x))


def test_attribute_mutation_replayed(recorder):
    class State:
        def __init__(self):
            self.calls = 0
            self.last = None
    s = State()

    def f(x, st):
        st.calls = st.calls + 1
        st.last = x * 2
        return x + 1
    g = kc.optimize(f, recorder)
    x = torch.randn(2)
    g(x, s)
    g(x, s)
    assert s.calls == 2
    assert_same(s.last, x * 2)


def test_reset_clears_caches(recorder):
    g = kc.optimize(f_add, recorder)
    g(torch.randn(2), torch.randn(2))
    kc.reset()
    assert kc.cache_entries(g) == []
    g(torch.randn(2), torch.randn(2))
    assert recorder.count == 2


def test_training_forward_with_grads(recorder):
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    g = kc.optimize(m.forward, recorder)
    x = torch.randn(5, 3)
    out = g(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for a, p in zip(grads, m.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_attribute_delete_replayed(recorder):
    class Obj:
        pass

    def f(x, o):
        del o.a
        o.b = 1
        return x + 1
    o = Obj()
    o.a = 3
    g = kc.optimize(f, recorder)
    assert_same(g(torch.ones(2), o), torch.ones(2) + 1)
    assert not hasattr(o, "a") and o.b == 1


def test_hit_path_guard_source_is_compact():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    g = kc.optimize(m.forward, Recorder())
    g(torch.randn(1, 2))
    src = kc.cache_entries(g)[0].check.__kiln_source__
    # shared prefixes are bound once (walrus) rather than re-walked for every parameter
    assert ":=" in src and src.count("L['self']") == 1


def test_torch_cond_is_one_graph(recorder):
    if not hasattr(torch, "cond"):
        pytest.skip("torch.cond missing")

    def f(x):
        y = x + 1
        return torch.cond(y.sum() > 0, lambda t: t * 2, lambda t: t - 2, (y,))
    x = torch.randn(3).abs()
    g = kc.optimize(f, recorder)
    assert_same(g(x), f(x))
    ex = kc.explain(f)(x)
    assert ex.break_count == 0 and ex.graph_count == 1 and recorder.count == 1


def test_swapped_or_reshaped_parameter_recompiles(recorder):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    opt = kc.optimize(model, recorder)
    x = torch.randn(2, 4)
    assert_same(opt(x), model(x))
    model[2].weight = torch.nn.Parameter(torch.randn(4, 4))  # swapped: same shape, new object
    assert_same(opt(x), model(x))
    assert recorder.count == 2
    model[3].bias = torch.nn.Parameter(torch.randn(4))
    model[4] = torch.nn.Linear(4, 4)  # a swapped submodule
    assert_same(opt(x), model(x))
    assert recorder.count == 3
    with torch.no_grad():  # in-place value changes need no recompile: values are graph inputs
        model[0].weight.mul_(2)
    assert_same(opt(x), model(x))
    assert recorder.count == 3
    model[1].weight = torch.nn.Parameter(torch.randn(4, 4).t().contiguous().t())  # new strides
    assert_same(opt(x), model(x))
    assert recorder.count == 4


# ---- constant tuples: one guard each (issue 7) ----------------------------------------------
def test_conv_tuples_are_one_guard_each():
    """A conv's stride/padding/dilation are one typed EQUALS_MATCH each, not TYPE_MATCH +
    LENGTH_MATCH + a guard per item (744 of a mobilenet's 1,395 guards)."""
    m = nn.Conv2d(2, 2, 3, stride=(2, 1), padding=1).eval()
    cg = kc.capture_graph(m.forward, (torch.randn(1, 2, 5, 5),), {})
    by_source: dict[str, list[str]] = {}
    for g in cg.guards:
        by_source.setdefault(g.source, []).append(g.kind)
    for name, value in (("stride", (2, 1)), ("padding", (1, 1)), ("dilation", (1, 1))):
        src = f"L['self'].{name}"
        assert by_source[src] == ["EQUALS_MATCH"]
        assert not any(s.startswith(src + "[") for s in by_source)
        (g,) = [g for g in cg.guards if g.source == src]
        assert g.expected == value and all(type(v) is int for v in g.expected)


@pytest.mark.parametrize("change", [(2, 2), (1, 1, 1), (True, 1), (1.0, 1), [1, 1]])
def test_changed_constant_tuple_recompiles(recorder, change):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = (1, 1)

        def forward(self, x):
            return x * self.scale[0] + self.scale[-1]
    m = M()
    g = kc.optimize(m, recorder)
    x = torch.randn(3)
    assert_same(g(x), m(x))
    assert_same(g(x), m(x))
    assert recorder.count == 1
    m.scale = change
    assert_same(g(x), m(x))
    assert recorder.count == 2  # (True, 1) == (1, 1), but its trace may differ: a new entry
