"""The README's capture section ("NumPy, side effects and torch.compiler's controls") as programs: each
claim is quoted from the README (so an edit there that drops it fails here) and its program is run under
``kiln.explain`` (the graph and break counts the claim implies) and under ``kiln.compile`` three times
with fresh inputs against eager."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import kiln

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTION = README.split("### NumPy, side effects and torch.compiler's controls", 1)[1].split("\n## ", 1)[0]
SECTION = " ".join(SECTION.split())  # the README wraps lines anywhere

_log = logging.getLogger("kiln.readme_example")


def numpy_as_tensor_code(x):
    a = x.numpy()
    return np.tanh(a * 2).sum(axis=0) + a.mean()


def side_effects_replayed(x):
    print("step", end="\r")
    _log.debug("replayed after the graph")
    warnings.warn("replayed", stacklevel=1)
    return x.sin() * 2


def manual_seed_replayed(x):
    y = x.cos()
    torch.manual_seed(3)
    return y + 1


def loss_built_in_forward(x):
    return nn.CrossEntropyLoss()(x, torch.tensor([1, 0, 2, 1]))


@torch.compiler.disable
def _opaque(y):
    return y + 1


def break_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x.T
        y = _opaque(y)
        return (y @ y).float()


def numpy_random_constant_draws(x):
    return x + torch.from_numpy(np.random.rand(4, 3).astype(np.float32))


def numpy_fft(x):
    return np.abs(np.fft.rfft(x.numpy(), axis=0))


def linear_built_inside(x):
    return nn.Linear(3, 2)(x).relu()


def linear_built_inside_and_returned(x):
    lin = nn.Linear(3, 2)
    return lin(x), lin


def disabled_function(x):
    return _opaque(x * 2) * 3


# (a phrase of the README section, the program, graphs, breaks)
EXAMPLES = [
    ("NumPy code is traced as tensor code", numpy_as_tensor_code, 1, 0),
    ("`print`, `logging`, `warnings.warn` and `torch.manual_seed` are replayed after the graph instead of "
     "breaking it", side_effects_replayed, 1, 0),
    ("`print`, `logging`, `warnings.warn` and `torch.manual_seed` are replayed after the graph instead of "
     "breaking it", manual_seed_replayed, 1, 0),
    ("losses built inside `forward` (`nn.CrossEntropyLoss()(...)`) stay in the graph", loss_built_in_forward, 1, 0),
    # the block's end is modelled in the resume function's graph: one break, as torch.compile counts
    ("a break inside `torch.autocast` resumes inside the block", break_inside_autocast, 2, 1),
    ("draws with constant arguments run in Python just before the graph", numpy_random_constant_draws, 1, 0),
    ("`np.fft` is traced as `torch.fft`", numpy_fft, 1, 0),
    ("`nn.Linear` and other `torch.nn` modules with parameters built inside compiled code stay in the graph",
     linear_built_inside, 1, 0),
    # built first: no graph before the break
    ("one that outlives the graph (returned, stored) is built in Python", linear_built_inside_and_returned, 1, 1),
    ("Functions marked with `torch.compiler.disable` are honoured", disabled_function, 2, 1),
]


@pytest.mark.parametrize(("phrase", "fn", "graphs", "breaks"), EXAMPLES, ids=[e[1].__name__ for e in EXAMPLES])
def test_readme_capture_example(phrase, fn, graphs, breaks):
    assert phrase in SECTION, f"the README no longer says: {phrase!r}"
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = kiln.explain(fn)(torch.randn(4, 3))
        assert (ex.graph_count, ex.break_count) == (graphs, breaks), ex.as_text()
        f = kiln.compile(fn, backend="aot_eager")
        for i in range(3):
            x = torch.randn(4, 3)
            torch.manual_seed(i)
            np.random.seed(i)
            want = fn(x)
            torch.manual_seed(i)
            np.random.seed(i)
            got = f(x)
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for w, g in zip(want, got):
                if isinstance(w, nn.Module):
                    assert type(g) is type(w)
                    continue
                assert type(g) is type(w), (type(g), type(w))
                np.testing.assert_allclose(np.asarray(g.detach() if isinstance(g, torch.Tensor) else g),
                                           np.asarray(w.detach() if isinstance(w, torch.Tensor) else w),
                                           rtol=1e-5, atol=1e-5)
