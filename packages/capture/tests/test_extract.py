"""The generated input extractor (extract.py): shared attribute/subscript reads bound once, the same
values as evaluating each source alone, identity-pinned inputs passed as the objects seen."""

from __future__ import annotations

import types

import torch

from kiln.capture.extract import extractor


def _frame(params, state):
    return {"args": (types.SimpleNamespace(param_groups=[{"params": params}], state=state),)}, {}


def test_shared_reads_are_bound_once_and_values_match_each_source():
    params = [torch.randn(3) for _ in range(2)]
    sources = []
    for i in range(2):
        p = f"L['args'][0].param_groups[0]['params'][{i}]"
        sources += [p, f"L['args'][0].state.get({p})['exp_avg']", f"L['args'][0].state.get({p})['step']"]
    fn = extractor(sources)
    text = fn.__kiln_source__
    assert text.count("L['args']") == 1, text  # the path read once
    assert text.count(".state") == 1, text
    assert text.count(".get") == 1, text  # the bound method, called once per parameter (one Tensor.__hash__)
    assert sum("(_e" in line for line in text.splitlines()) == 2, text
    for _ in range(3):  # fresh objects every call: the values are read, never cached
        params = [torch.randn(3) for _ in range(2)]
        state = {p: {"exp_avg": torch.randn(3), "step": torch.tensor(1.0)} for p in params}
        L, G = _frame(params, state)
        got = fn(L, G)
        want = [eval(s, {}, {"L": L, "G": G}) for s in sources]  # noqa: S307 (test sources)
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))


def test_identity_pinned_inputs_are_the_objects_seen():
    seen = torch.randn(2)
    fn = extractor(["G['w']", "L['x']"], [seen, None], {"G['w']"})
    x = torch.randn(2)
    got = fn({"x": x}, {"w": torch.randn(2)})
    assert got[0] is seen and got[1] is x
