"""Model-output objects as inputs (what a resume function after ``loss.backward()`` receives): dict
subclasses read by item and by attribute, the same tensor reached through two sources, and views whose
base has sizes of its own. Each program runs several times with fresh values and sizes, against eager."""

from __future__ import annotations

import torch

import kiln.capture as kc
from kiln.graph import GuardSet

from .conftest import assert_same


class ByAttribute(dict):
    """A dict whose attributes are its items (``out.logits`` is ``out["logits"]``)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Both(dict):
    """Like transformers' ModelOutput: each field is an item and an attribute."""

    def __init__(self, **fields):
        super().__init__(**fields)
        for k, v in fields.items():
            object.__setattr__(self, k, v)


def test_dict_subclass_items_read_through_getattr_are_inputs(recorder):
    """``self[name]`` inside a user ``__getattr__`` used to return the real tensor of the first call
    (caught later as "a tensor created outside the graph", the frame then ran eagerly)."""
    def f(out):
        return out.logits * 2 + out["logits"].sum()
    g = kc.optimize(f, recorder)
    for n in (4, 4, 6, 9):
        out = ByAttribute(logits=torch.randn(n))
        assert_same(g(out), f(out))
    assert recorder.count >= 1 and not kc.explain(f)(ByAttribute(logits=torch.randn(3))).eager_frames


def test_one_tensor_through_an_item_and_an_attribute(recorder):
    """``out["loss"]`` and ``out.loss`` both name a placeholder ``l_out_loss``: fx writes placeholder
    targets as the forward's parameters, so the second one once made the graph a SyntaxError."""
    def f(out):
        return out["loss"] * 3 + out.loss
    g = kc.optimize(f, recorder)
    for _ in range(3):
        t = torch.randn(())
        out = Both(loss=t, logits=torch.randn(2))
        assert_same(g(out), f(out))
    assert recorder.count == 1


def test_view_input_whose_base_has_its_own_sizes():
    """A dynamic view of a larger base: the fake view is made over a fake base with symbols of its own;
    every symbol a guard names is bound to a source, so a call that misses the guards can say why."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    def f(y):
        return y.float().log_softmax(-1).sum(-1)
    g = kc.optimize(f, backend, dynamic=True)
    for b, t in ((2, 16), (2, 24), (3, 5), (1, 1)):
        y = torch.randn(b * t + 3, 8)[3:].view(b, t, 8)
        assert_same(g(y), f(y))
    for entry in kc.cache_entries(g):
        bound = {str(x.expected) for x in entry.guards.guards if x.kind == "SYMBOL"}
        for x in entry.guards.guards:
            if x.kind == "SHAPE_EXPR":
                names = set(__import__("re").findall(r"\b(?:s\d+|stride\d+)\b", str(x.expected)))
                assert names <= bound, (x.expected, bound)
        GuardSet(entry.guards.guards).first_failure({"y": torch.randn(5, 8)}, {})  # no NameError
