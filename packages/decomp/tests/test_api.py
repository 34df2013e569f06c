"""The public API: tables, select, register, decompose on aten and torch dialects, trace, lower, CLI."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

import kiln.decomp as kd
from kiln.decomp import DecompositionError, decompose, lower, register, select, table, trace
from kiln.decomp.cli import main as cli_main
from kiln.decomp.cli import ops_in_text
from kiln.graph import CORE_ATEN_OPS, print_graph, verify

aten = torch.ops.aten


def _ops(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem}


def test_tables_are_read_only_mappings_with_dialects():
    core = table("core_aten")
    assert aten.gelu.default in core and callable(core[aten.gelu.default])
    assert core.dialect.value == "core_aten" and table("prims").dialect.value == "prims"
    # the only core op with a core rule is view, rewritten only when its input's layout cannot be viewed
    assert [name for name in core.names() if name in CORE_ATEN_OPS] == ["aten.view.default"]
    assert set(core) <= set(table("inductor")) and set(core) <= set(table("prims"))
    with pytest.raises(KeyError, match="unknown decomposition table"):
        table("nope")
    with pytest.raises(TypeError):
        core[aten.gelu.default] = None  # type: ignore[index]


def test_every_core_op_has_a_prims_rule():
    prims = set(table("prims").names())
    sym = {"aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default"}
    assert sorted(set(CORE_ATEN_OPS) - prims - sym) == []


def test_select_and_unknown_ops():
    sub = select([aten.gelu, "aten.silu.default"], table("core_aten"))
    assert set(sub.names()) == {"aten.gelu.default", "aten.silu.default"} and sub.dialect is None
    with pytest.raises(KeyError, match="no decomposition for aten.mm.default"):
        select(["aten.mm.default"], table("core_aten"))


def test_decompose_aten_graph_preserves_placeholders_outputs_and_meta():
    x = torch.randn(4, 6)
    g = trace(lambda x: (torch.nn.functional.gelu(x).softmax(-1), x.t()), [x])
    out = decompose(g, table("core_aten"))
    verify(out, "core_aten")
    assert [n.name for n in out.graph.nodes if n.op == "placeholder"] == ["arg0"]
    assert all("val" in n.meta for n in out.graph.nodes if n.op not in ("output",))
    got, exp = out(x), (torch.nn.functional.gelu(x).softmax(-1), x.t())
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)


def test_decompose_torch_dialect_graph_retraces_through_dispatcher():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(8)

        def forward(self, x):
            return torch.nn.functional.silu(self.ln(x)).mean(dim=-1)

    m = M()
    gm = fx.symbolic_trace(m)  # torch dialect with call_module: re-traced, parameters lifted as constants
    x = torch.randn(3, 8)
    out = decompose(gm, table("prims"), [x])
    verify(out, "prims")
    torch.testing.assert_close(out(x), m(x))


def test_select_leaves_other_ops_in_place():
    g = trace(lambda x: torch.nn.functional.gelu(torch.nn.functional.silu(x)), [torch.randn(5)])
    out = decompose(g, select(["aten.silu.default"], table("core_aten")))
    assert aten.gelu.default in _ops(out) and aten.silu.default not in _ops(out)


def test_user_register_overrides_and_invalidates_cache():
    before = table("core_aten")
    calls = []

    @register(aten.hardtanh.default)
    def my_hardtanh(self, min_val=-1, max_val=1):
        calls.append(1)
        return aten.clamp.default(self, min_val, max_val)

    try:
        after = table("core_aten")
        assert after is not before and after[aten.hardtanh.default] is my_hardtanh
        g = trace(lambda x: torch.nn.functional.hardtanh(x), [torch.randn(5)])
        decompose(g, after)
        assert calls
    finally:
        kd.registry.USER.entries.clear()


def test_missing_rule_is_reported_with_op_names():
    g = trace(lambda x: torch.special.bessel_j0(x), [torch.randn(5)])
    with pytest.raises(DecompositionError, match="aten.special_bessel_j0.default"):
        decompose(g, table("core_aten"), check=True)
    out = decompose(g, table("core_aten"), check=False)
    assert aten.special_bessel_j0.default in _ops(out)


def test_decomposition_returning_not_implemented_keeps_op():
    g = trace(lambda x: torch.nn.functional.adaptive_max_pool2d(x, (3, 3)), [torch.randn(1, 2, 7, 7)])
    out = decompose(g, table("core_aten"), check=False)  # uneven windows: the rule declines
    assert aten.adaptive_max_pool2d.default in _ops(out)


def test_trace_records_backward_and_functionalizes_fresh_inplace():
    x = torch.randn(4, 4, requires_grad=True)

    def f(x):
        y = x * 2
        y += 1
        return torch.autograd.grad(torch.nn.functional.gelu(y).sum(), [x])

    g = trace(f, [x], functionalize=True)
    ops = _ops(g)
    assert aten.gelu_backward.default in ops and aten.add_.Tensor not in ops
    torch.testing.assert_close(g(x)[0], f(x)[0])
    with pytest.raises(DecompositionError, match="writes to a graph input"):
        trace(lambda x: x.add_(1), [torch.randn(3)], functionalize=True)


def test_dynamic_shapes_are_rebuilt_from_input_symbols():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.randn(6, 8))
    assert isinstance(x.shape[0], torch.SymInt)
    g = trace(lambda x: torch.nn.functional.silu(x).reshape(-1), [x])
    for name in ("core_aten", "prims"):
        out = decompose(g, table(name), check=True)
        if name == "prims":  # reshape's explicit sizes are rebuilt from the input's symbolic sizes
            assert any(n.target is aten.sym_size.int for n in out.graph.nodes)
        real = torch.randn(5, 3)  # other sizes: the graph reads them from its input
        torch.testing.assert_close(out(real), torch.nn.functional.silu(real).reshape(-1))


def test_inductor_table_rewrites_small_gemm_and_pow():
    g = trace(lambda a, b, x: (a @ b, x ** 2), [torch.randn(4, 1), torch.randn(1, 5), torch.randn(3)])
    out = decompose(g, table("inductor"))
    assert aten.mm.default not in _ops(out) and aten.pow.Tensor_Scalar not in _ops(out)
    a, b, x = torch.randn(4, 1), torch.randn(1, 5), torch.randn(3)
    for got, exp in zip(out(a, b, x), (a @ b, x ** 2)):
        torch.testing.assert_close(got, exp)


def test_lower_pipeline_keeps_each_pass_text():
    g = trace(lambda x: torch.nn.functional.mish(x), [torch.randn(4)])
    result = lower(g, "prims", keep_text=True)
    assert [r.name for r in result.records] == ["to_core_aten", "to_prims"]
    assert "aten.tanh.default" in result.records[0].text and "kiln_prims.tanh" in result.records[1].text


def test_prims_have_eager_and_fake_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode

    P = torch.ops.kiln_prims
    x = torch.randn(3, 4)
    torch.testing.assert_close(P.broadcast_in_dim(torch.arange(4.0), [3, 4], [1]), torch.arange(4.0).expand(3, 4))
    torch.testing.assert_close(P.sum(x, [1]), x.sum(1))
    assert P.convert_element_type(x, torch.float16).dtype == torch.float16
    with FakeTensorMode() as mode:
        f = mode.from_tensor(x)
        assert P.amax(f, [0]).shape == (4,) and P.mm(f, P.permute(f, [1, 0])).shape == (3, 3)


def test_cli_lists_tables_and_missing_ops(tmp_path, capsys):
    assert cli_main(["list", "--table", "core_aten"]) == 0
    out = capsys.readouterr().out
    assert "aten.gelu.default" in out and "ops decomposed by table 'core_aten'" in out
    g = trace(lambda x: torch.special.bessel_j0(torch.nn.functional.gelu(x)), [torch.randn(3)])
    path = tmp_path / "graph.txt"
    path.write_text(print_graph(g))
    assert cli_main(["list", "--missing-from", str(path)]) == 1
    out = capsys.readouterr().out
    assert "aten.special_bessel_j0.default" in out and "aten.gelu.default" not in out.split("\n", 1)[1]
    assert ops_in_text(g.code) >= {"aten.gelu.default"}


def test_decompose_aten_graph_under_ambient_autocast_keeps_traced_dtypes():
    # an ATen graph holds autocast's casts already (autograd traced them); re-tracing it while the
    # caller's autocast is still on (kiln.inductor compiles on the first call, inside the user's
    # torch.autocast) must not cast again: a float32 bmm stays float32, as the compiled graph runs it
    def f(q, k, w, b):
        s = torch.bmm(q, k).softmax(-1)
        return torch.nn.functional.linear(s, w, b), s @ s
    args = [torch.randn(2, 4, 8), torch.randn(2, 8, 4), torch.randn(3, 4), torch.randn(3)]
    g = trace(f, args)
    want = {n.name: n.meta["val"].dtype for n in g.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert set(want.values()) == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = decompose(g, table("inductor"))
    got = [n.meta["val"].dtype for n in out.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert set(got) == {torch.float32}, print_graph(out)
    assert aten._to_copy.default not in _ops(out)
    for a, e in zip(out(*args), f(*args)):
        torch.testing.assert_close(a, e)
