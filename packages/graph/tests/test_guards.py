from __future__ import annotations

import types

import pytest
import torch

from kiln.graph import Guard, GuardSet, global_state, tensor_expectation, type_name


def _tensor_guard(name: str, t: torch.Tensor, dyn: frozenset[int] = frozenset()) -> Guard:
    return Guard(f"L[{name!r}]", "TENSOR_MATCH", tensor_expectation(t, dyn))


def test_tensor_match_checks_shape_dtype_stride_and_grad() -> None:
    x = torch.randn(2, 3)
    check = GuardSet((_tensor_guard("x", x),)).compile()
    assert check({"x": torch.randn(2, 3)}, {})
    assert not check({"x": torch.randn(2, 4)}, {})
    assert not check({"x": torch.randn(2, 3, dtype=torch.float64)}, {})
    assert not check({"x": torch.randn(3, 2).t()}, {})  # same shape, other strides
    assert not check({"x": torch.randn(2, 3, requires_grad=True)}, {})
    assert not check({"x": 3}, {})


def test_dynamic_dims_are_not_pinned() -> None:
    check = GuardSet((_tensor_guard("x", torch.randn(2, 3), frozenset({0})),)).compile()
    assert check({"x": torch.randn(7, 3)}, {})
    assert not check({"x": torch.randn(7, 4)}, {})


def test_symbols_bind_and_relate() -> None:
    gs = GuardSet((
        Guard("L['x'].size(0)", "SYMBOL", "s0"),
        Guard("L['y'].size(0)", "SYMBOL", "s0"),
        Guard("", "SHAPE_EXPR", "s0 >= 2"),
    ))
    check = gs.compile()
    assert check({"x": torch.ones(5), "y": torch.ones(5)}, {})
    assert not check({"x": torch.ones(5), "y": torch.ones(6)}, {})
    assert not check({"x": torch.ones(1), "y": torch.ones(1)}, {})


def test_constants_types_lengths_and_keys() -> None:
    gs = GuardSet((
        Guard("L['n']", "EQUALS_MATCH", 3),
        Guard("L['xs']", "LENGTH_MATCH", 2),
        Guard("L['d']", "DICT_KEYS", ("a", "b")),
        Guard("L['m']", "TYPE_MATCH", type_name(torch.nn.Linear)),
    ))
    check = gs.compile()
    good = {"n": 3, "xs": [1, 2], "d": {"a": 1, "b": 2}, "m": torch.nn.Linear(1, 1)}
    assert check(good, {})
    assert not check({**good, "n": 3.0}, {})  # 3.0 == 3 but is a float: a different trace
    assert not check({**good, "xs": [1]}, {})
    assert not check({**good, "d": {"b": 1, "a": 2}}, {})
    assert not check({**good, "m": torch.nn.Conv1d(1, 1, 1)}, {})


def test_global_state_guard_sees_grad_mode() -> None:
    check = GuardSet((Guard("", "GLOBAL_STATE", global_state()),)).compile()
    assert check({}, {})
    with torch.no_grad():
        assert not check({}, {})


def test_first_failure_names_guard_and_actual_value() -> None:
    gs = GuardSet((Guard("L['n']", "EQUALS_MATCH", 3), _tensor_guard("x", torch.ones(2))))
    failed = gs.first_failure({"n": 3, "x": torch.ones(4)}, {})
    assert failed is not None
    guard, actual = failed
    assert guard.source == "L['x']" and "(4,)" in actual


def test_relation_over_an_unbound_symbol_fails_instead_of_crashing() -> None:
    """A shape relation naming a symbol no SYMBOL guard binds (a view input's base size, before capture
    bound those) is reported as the failing guard, not a NameError out of the recompile path."""
    gs = GuardSet((Guard("L['x'].size()[0]", "SYMBOL", "s0", "dynamic size"),
                   Guard("", "SHAPE_EXPR", "s17*s0 >= 2", "shape assumption")))
    failed = gs.first_failure({"x": torch.ones(3)}, {})
    assert failed is not None and failed[0].expected == "s17*s0 >= 2" and "no source" in failed[1]


def test_missing_source_fails_instead_of_crashing() -> None:
    gs = GuardSet((Guard("L['gone'].weight", "NOT_NONE", None),))
    failed = gs.first_failure({}, {})
    assert failed is not None and "KeyError" in failed[1]


def test_json_round_trip_drops_in_process_identity() -> None:
    gs = GuardSet((_tensor_guard("x", torch.ones(2, 2)), Guard("L['m']", "ID_MATCH", 1234),
                   Guard("L['n']", "EQUALS_MATCH", 3)))
    back = GuardSet.from_json(gs.to_json())
    assert [g.kind for g in back] == ["TENSOR_MATCH", "EQUALS_MATCH"]
    assert back.compile()({"x": torch.ones(2, 2), "n": 3}, {})


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown guard kind"):
        Guard("L['x']", "FANCY", 1)


def test_a_device_without_index_matches_any_index() -> None:
    from kiln.graph import device_matches

    assert device_matches(torch.device("cuda", 1), torch.device("cuda"))
    assert not device_matches(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not device_matches(torch.device("cpu"), torch.device("cuda"))


def test_compiled_tensor_guard_accepts_an_indexed_device_for_an_index_free_spec() -> None:
    guard = Guard("L['x']", "TENSOR_MATCH", ("torch.float32", "meta", (2,), (1,), False))
    check = GuardSet((guard,)).compile()
    assert check({"x": torch.empty(2, device="meta")}, {})
    assert not check({"x": torch.empty(2)}, {})


def test_check_and_gather_reads_shared_prefixes_once_and_modules_globals() -> None:
    import sys

    import torch

    from kiln.graph import Guard, GuardSet, tensor_expectation
    lin = torch.nn.Linear(3, 2)
    sys.modules[__name__].KILN_TEST_FLAG = 7  # type: ignore[attr-defined]
    mod = f"__import__('sys').modules[{__name__!r}]"
    guards = GuardSet((
        Guard("L['m'].weight", "TENSOR_MATCH", tensor_expectation(lin.weight)),
        Guard("L['m'].bias", "TENSOR_MATCH", tensor_expectation(lin.bias)),
        Guard("L['m'].in_features", "EQUALS_MATCH", 3),
        Guard("L['m']", "TYPE_MATCH", "torch.nn.modules.linear:Linear"),
        Guard(f"{mod}.KILN_TEST_FLAG", "EQUALS_MATCH", 7),
        Guard("len(L['xs'])", "EQUALS_MATCH", 2),
    ))
    gather = guards.compile_gather(["L['m'].weight", "L['xs'][1]"])
    L = {"m": lin, "xs": [1, 5]}
    got = gather(L, {})
    assert got is not None and got[0] is lin.weight and got[1] == 5
    assert gather({"m": torch.nn.Linear(3, 4), "xs": [1, 5]}, {}) is None
    assert gather({"m": lin, "xs": [1]}, {}) is None  # len guard fails; xs[1] would raise too
    sys.modules[__name__].KILN_TEST_FLAG = 8  # type: ignore[attr-defined]
    assert gather(L, {}) is None and guards.compile()(L, {}) is False
    # one read per distinct prefix: L['m'] once for its guards and the output (13 walks without)
    assert gather.__kiln_reads__ < 13


def test_plan_and_generated_checks_agree() -> None:
    """The compile-free plan (large sets, runtime loads) and the generated chain (small sets) give
    the same answers on every kind of guard, passing or failing."""
    import torch

    from kiln.graph import Guard, global_state, tensor_expectation
    from kiln.graph.guards_codegen import generated_check
    from kiln.graph.guards_plan import plan_check

    lin, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    guards = (
        Guard("", "GLOBAL_STATE", global_state()),
        Guard("L['x']", "TENSOR_MATCH", tensor_expectation(x, frozenset({0}))),
        Guard("L['m'].weight", "TENSOR_MATCH", tensor_expectation(lin.weight)),
        Guard("L['m']", "TYPE_MATCH", "torch.nn.modules.linear:Linear"),
        Guard("L['m'].training", "EQUALS_MATCH", True),
        Guard("L['m'].in_features", "EQUALS_MATCH", 3),
        Guard("L['opts']", "DICT_KEYS", ("a", "b")),
        Guard("L['opts']['b']", "LENGTH_MATCH", 2),
        Guard("L['opts']['a']", "IS_NONE", None),
        Guard("L['m'].bias", "NOT_NONE", None),
        Guard("L['m'].weight", "ID_MATCH", id(lin.weight)),
        Guard("L['m'].bias", "ID_MATCH", id(lin.bias)),
        Guard("L['x'].size()[0]", "SYMBOL", "s0"),
        Guard("L['y'].size()[0]", "SYMBOL", "s0"),
        Guard("", "SHAPE_EXPR", "s0 >= 2"),
    )
    good = {"x": x, "m": lin, "opts": {"a": None, "b": [1, 2]}, "y": torch.randn(4)}
    frames = [good, dict(good, x=torch.randn(6, 3), y=torch.randn(6)), dict(good, x=torch.randn(4, 2)),
              dict(good, y=torch.randn(5)), dict(good, x=torch.randn(1, 3), y=torch.randn(1)),
              dict(good, m=torch.nn.Linear(3, 3)), dict(good, m=torch.nn.Linear(3, 2).eval()),
              dict(good, opts={"b": [1, 2], "a": None}), dict(good, opts={"a": 1, "b": [1, 2]}),
              dict(good, opts={"a": None, "b": [1]}), dict(good, x=x.double()),
              dict(good, m=_with_new_bias(lin))]
    plan, generated = plan_check(guards), generated_check(guards)
    answers = []
    for frame in frames:
        try:
            want = generated(frame, {})
        except Exception:  # noqa: BLE001 - the generated chain raises where a source cannot be read
            want = False
        assert plan(frame, {}) is want, frame
        answers.append(want)
    assert answers[0] is True and answers[1] is True and not any(answers[2:])


def _with_new_bias(lin):  # an equal module whose bias is another Parameter object (ID_MATCH fails)
    import copy

    import torch

    other = copy.copy(lin)
    other._parameters = dict(lin._parameters, bias=torch.nn.Parameter(lin.bias.detach().clone()))
    return other


# ---- constant tuples: one typed EQUALS_MATCH (issue 7: fewer guards per load) ---------------------

_TUPLE_CASES = [((1, 1), (1, 1), True), ((1, 1), (True, 1), False), ((1, 1), (1.0, 1), False),
                ((1, 1), (1, 2), False), ((1, 1), (1, 1, 1), False), ((1, 1), [1, 1], False),
                ((), (), True), (((1, 2), "a"), ((1, 2), "a"), True), (((1, 2), "a"), ((1, True), "a"), False),
                ((None, 2.5), (None, 2.5), True), ((None, 2.5), (None, 2), False)]


@pytest.mark.parametrize("expected,actual,ok", _TUPLE_CASES)
@pytest.mark.parametrize("path", ["generated", "plan", "plan_bare"])
def test_equals_match_on_a_tuple_compares_item_types(expected, actual, ok, path) -> None:
    from kiln.graph.guards_codegen import generated_check
    from kiln.graph.guards_plan import plan_check
    if path == "plan_bare":  # a guard on an argument itself is checked one by one
        guards = (Guard("L['s']", "EQUALS_MATCH", expected),)
        L = {"s": actual}
    else:  # an attribute: grouped with other EQUALS_MATCH guards (one comparison per kind)
        guards = (Guard("L['m'].s", "EQUALS_MATCH", expected), Guard("L['m'].k", "EQUALS_MATCH", (3, 3)),
                  Guard("L['m'].n", "EQUALS_MATCH", 2))

        class M:
            s, k, n = actual, (3, 3), 2
        L = {"m": M()}
    check = generated_check(guards) if path == "generated" else plan_check(guards)
    assert bool(check(L, {})) is ok


def test_first_failure_names_the_tuple_source() -> None:
    gs = GuardSet((Guard("L['m'].stride", "EQUALS_MATCH", (1, 1)), Guard("L['m'].padding", "EQUALS_MATCH", (0, 0))))

    class M:
        stride, padding = (1, 1), (True, 0)
    failed = gs.first_failure({"m": M()}, {})
    assert failed is not None and failed[0].source == "L['m'].padding" and failed[1] == "(True, 0)"


def test_tuple_guard_survives_json() -> None:
    gs = GuardSet((Guard("L['m'].s", "EQUALS_MATCH", ((1, 2.0), True, None, "x")),))
    back = GuardSet.from_json(gs.to_json())
    assert back.guards == gs.guards
    check = back.compile()

    class M:
        s = ((1, 2.0), True, None, "x")
    assert check({"m": M()}, {})
    M.s = ((1, 2), True, None, "x")
    assert not check({"m": M()}, {})


def test_simplified_drops_only_implied_guards() -> None:
    s = "L['m'].stride"
    gs = GuardSet((
        Guard("", "GLOBAL_STATE", global_state()),
        Guard(s, "TYPE_MATCH", "builtins:tuple"),
        Guard(s, "LENGTH_MATCH", 2),
        Guard(f"{s}[0]", "EQUALS_MATCH", 1),
        Guard(f"{s}[1]", "TYPE_MATCH", "builtins:int"),
        Guard(s, "EQUALS_MATCH", (1, 2)),
        Guard(s, "NOT_NONE", None),
        Guard(s, "EQUALS_MATCH", (1, 2)),  # an exact duplicate
        Guard("L['m'].w", "TENSOR_MATCH", tensor_expectation(torch.ones(2))),
        Guard("L['m'].w", "NOT_NONE", None),
        Guard("L['m'].w", "TYPE_MATCH", "torch.nn.parameter:Parameter"),  # not implied by the tensor
        Guard("L['d']", "DICT_KEYS", ("a", "b")),
        Guard("L['d']", "LENGTH_MATCH", 2),
        Guard("L['e']", "LENGTH_MATCH", 2),  # nothing implies it
        Guard("L['f']", "TYPE_MATCH", "builtins:list"),  # not implied: f's EQUALS_MATCH is a tuple
        Guard("L['f']", "EQUALS_MATCH", (1,)),
        Guard(f"{s}[0]", "IS_NONE", None),  # contradicts the tuple: kept (the set fails, as before)
    ))
    kept = gs.simplified()
    assert [(g.source, g.kind) for g in kept] == [
        ("", "GLOBAL_STATE"), (s, "EQUALS_MATCH"), ("L['m'].w", "TENSOR_MATCH"),
        ("L['m'].w", "TYPE_MATCH"), ("L['d']", "DICT_KEYS"), ("L['e']", "LENGTH_MATCH"),
        ("L['f']", "TYPE_MATCH"), ("L['f']", "EQUALS_MATCH"), (f"{s}[0]", "IS_NONE")]
    # the same answer as the full set on inputs that pass and fail
    class M:
        stride, w = (1, 2), torch.nn.Parameter(torch.ones(2), requires_grad=False)
    for stride in [(1, 2), (True, 2), (1, 2, 3), [1, 2], (1, 2.0)]:
        M.stride = stride
        L = {"m": M(), "d": {"a": 1, "b": 2}, "e": [0, 0], "f": (1,)}
        assert gs.compile()(L, {}) == kept.compile()(L, {}) is False  # IS_NONE on [0] always fails
    no_contradiction = GuardSet(tuple(g for g in gs if g.kind != "IS_NONE" and g.source != "L['f']"))
    for stride in [(1, 2), (True, 2), (1, 2, 3), [1, 2], (1, 2.0)]:
        M.stride = stride
        L = {"m": M(), "d": {"a": 1, "b": 2}, "e": [0, 0], "f": (1,)}
        assert no_contradiction.compile()(L, {}) == no_contradiction.simplified().compile()(L, {}) \
            == (stride == (1, 2) and type(stride[1]) is int and type(stride) is tuple and type(stride[0]) is int)


# ---- tensor subclasses with a dispatch of their own never satisfy TENSOR_MATCH ------------------

class _Wrapper(torch.Tensor):
    """A wrapper subclass like DTensor or AsyncCollectiveTensor: same metadata, no storage."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> _Wrapper:
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device)
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        unwrap = lambda t: t.elem if isinstance(t, _Wrapper) else t  # noqa: E731
        return func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))


@pytest.mark.parametrize("dynamic", [False, True])
def test_tensor_match_rejects_a_wrapper_subclass_and_accepts_plain_kinds(dynamic: bool) -> None:
    """A plain tensor's entry handed a wrapper of the same shape would pass its kernels a null
    pointer; parameters, buffers and fake tensors still match. Every checker answers alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.graph.guards_codegen import generated_check
    from kiln.graph.guards_plan import plan_check

    x = torch.randn(4, 3)
    dyn = frozenset({0}) if dynamic else frozenset()
    # a bare argument is checked alone, a module's tensors (attributes) as one group
    many = (Guard("L['x']", "TENSOR_MATCH", tensor_expectation(x, dyn)),
            *(Guard(f"L['m'].t{i}", "TENSOR_MATCH", tensor_expectation(x, dyn)) for i in range(3)))
    checks = [plan_check(many[:1]), generated_check(many[:1]), plan_check(many), generated_check(many)]
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    for value, ok in ((x.clone(), True), (torch.nn.Parameter(x.clone(), requires_grad=False), True),
                      (torch.nn.Buffer(x.clone()), True), (fake, True), (_Wrapper(x.clone()), False)):
        for where in ("x", "m"):
            frame = {"x": value if where == "x" else x.clone(),
                     "m": types.SimpleNamespace(t0=x.clone(), t1=value if where == "m" else x.clone(), t2=x.clone())}
            for check in checks[2:] if where == "m" else checks:  # (the one-guard checks read only L['x'])
                assert check(frame, {}) is ok, (type(value).__name__, where, check)


def test_plan_checks_a_kv_cache_of_symbolic_tensors_as_the_generated_chain_does() -> None:
    """Tensors with symbolic dims read through attributes (a decoder's KV cache: grouped and compared
    as tuples by the plan), beside a static one, their sizes and strides bound through ``.size()[i]`` /
    ``.stride()[i]`` chains, one symbol read at two places and relations over them: the plan answers
    as the generated chain on passing and failing frames."""
    from kiln.graph.guards_codegen import generated_check
    from kiln.graph.guards_plan import plan_check

    def cache(seq: int, batch: int = 2, **kw) -> types.SimpleNamespace:
        keys, values = torch.randn(batch, 2, seq, 8), torch.randn(batch, 2, seq, 8)
        return types.SimpleNamespace(layers=[types.SimpleNamespace(keys=keys, values=values)],
                                     pos=torch.zeros(4, 3), **kw)

    good = cache(5)
    kv = tensor_expectation(good.layers[0].keys, frozenset({0, 2}), strides=(None, None, 8, 1))
    guards = (
        Guard("L['c'].layers[0].keys", "TENSOR_MATCH", kv),
        Guard("L['c'].layers[0].values", "TENSOR_MATCH", kv),
        Guard("L['c'].pos", "TENSOR_MATCH", tensor_expectation(good.pos)),
        Guard("L['c'].layers[0].keys.size()[0]", "SYMBOL", "s0"),
        Guard("L['c'].layers[0].keys.size()[2]", "SYMBOL", "s1"),
        Guard("L['c'].layers[0].keys.stride()[0]", "SYMBOL", "st0"),
        Guard("L['c'].layers[0].values.size()[0]", "SYMBOL", "s0"),
        Guard("L['c'].layers[0].values.size()[2]", "SYMBOL", "s2"),
        Guard("", "SHAPE_EXPR", "st0 == 16 * s1"),
        Guard("", "SHAPE_EXPR", "s1 >= 2"),
        Guard("", "SHAPE_EXPR", "(s1 == s2)"),
    )

    def swap(c, **kw):
        layer = types.SimpleNamespace(**{**vars(c.layers[0]), **kw})
        return types.SimpleNamespace(**{**vars(c), "layers": [layer]})

    other = cache(9, batch=3)
    frames = [good, other, cache(1), swap(good, values=torch.randn(3, 2, 5, 8)),
              swap(good, values=torch.randn(2, 2, 6, 8)), swap(good, keys=torch.randn(2, 3, 5, 8)),
              swap(good, keys=torch.randn(2, 2, 5, 8, 1)), swap(good, keys=torch.randn(2, 2, 5, 8).double()),
              swap(good, keys=torch.randn(2, 2, 5, 8, requires_grad=True)),
              swap(good, keys=torch.randn(2, 2, 8, 5).transpose(2, 3)), swap(good, keys=3),
              types.SimpleNamespace(**{**vars(good), "pos": torch.zeros(4, 4)})]
    plan, generated = plan_check(guards), generated_check(guards)
    answers = []
    for frame in frames:
        try:
            want = generated({"c": frame}, {})
        except Exception:  # noqa: BLE001 - the generated chain raises where a source cannot be read
            want = False
        assert plan({"c": frame}, {}) is want, frame
        answers.append(want)
    assert answers[:2] == [True, True] and not any(answers[2:]), repr(answers)
    cuda_kv = ("torch.float32", "cuda", *kv[2:])  # an index-free device: any cuda:N, never the CPU
    cuda_plan = plan_check((Guard("L['c'].layers[0].keys", "TENSOR_MATCH", cuda_kv), *guards[1:]))
    assert cuda_plan({"c": good}, {}) is False


def test_state_get_entries_are_read_once_and_checked_as_the_plan_does() -> None:
    """An optimizer's ``state.get(param)`` entry, read by several guards per parameter (its type, keys and
    tensors), is bound once in the generated chain, its key read through names bound before; the chain and the plan answer alike on frames that
    pass and on frames whose entry changed (a tensor's shape, a missing key, no entry at all)."""
    from kiln.graph.guards_codegen import generated_check
    from kiln.graph.guards_plan import plan_check

    params = [torch.randn(3), torch.randn(3)]

    def frame(state: dict) -> dict:
        return {"opt": types.SimpleNamespace(state=state, params=params)}

    def entry() -> dict:
        return {"step": torch.zeros(()), "exp_avg": torch.zeros(3)}
    good = {p: entry() for p in params}
    guards = []
    for i in range(2):
        src = f"L['opt'].state.get(L['opt'].params[{i}])"
        guards += [Guard(src, "TYPE_MATCH", type_name(dict)), Guard(src, "DICT_KEYS", ("step", "exp_avg")),
                   Guard(f"{src}['step']", "TENSOR_MATCH", tensor_expectation(torch.zeros(()))),
                   Guard(f"{src}['exp_avg']", "TENSOR_MATCH", tensor_expectation(torch.zeros(3)))]
    chain, plan = generated_check(tuple(guards)), plan_check(tuple(guards))
    text = chain.__kiln_source__
    for i in range(2):  # one read of each entry, bound and reused, its key read through the bound prefix
        assert text.count(f".get(_p0.params[{i}])") == 1, text
    assert text.count("L['opt']") == 1, text
    shape = {p: entry() for p in params}
    shape[params[1]]["exp_avg"] = torch.zeros(4)
    key = {p: entry() for p in params}
    del key[params[0]]["step"]
    for state, ok in ((good, True), (shape, False), (key, False), ({params[0]: entry()}, False)):
        assert chain(frame(state), {}) is ok and plan(frame(state), {}) is ok, state
