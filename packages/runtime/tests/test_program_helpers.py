"""kiln.runtime.program_helpers: the constant code saved programs import instead of carrying."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from kiln.runtime import program_helpers as H


def _g(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_imported_with_the_runtime_not_at_a_load():
    # a program's first import of it would be inside a new machine's load (and compile it without .pyc)
    code = "import sys, kiln.runtime; print('kiln.runtime.program_helpers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_restride_copies_only_when_the_strides_differ():
    nchw = _g(2, 3, 4, 5)
    got = H.restride(nchw, (2, 3, 4, 5), (60, 1, 15, 3))
    assert got.stride() == (60, 1, 15, 3) and torch.equal(got, nchw)
    assert H.restride(nchw, (2, 3, 4, 5), (60, 20, 5, 1)) is nchw
    fresh = H.restride(None, (2, 3), (3, 1), torch.float16, "cpu")
    assert fresh.shape == (2, 3) and fresh.dtype == torch.float16


def test_ext_callers_append_constants_take_views_and_restride():
    rows = [[[None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], [2, 6, 8, 8], [384, 1, 48, 6]],
            [[], [3, 5], [5, 1], [[3, 4], [1, 3], 0], None],
            [[], [4, 4], [4, 1], None, [[4, 2], [2, 1], 0], [[2, 4], [1, 2], 2]]]
    table, ext, ext2, ext3 = H.ext_callers(json.dumps(rows))
    assert table[1][3] == ((3, 4), (1, 3), 0)
    x, w = _g(2, 4, 8, 8), _g(6, 4, 3, 3)
    got = ext(torch.convolution, 0, x, w)
    assert got.stride() == (384, 1, 48, 6)
    assert torch.equal(got, torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    a, b = _g(12), _g(4, 5)
    assert torch.equal(ext2(torch.mm, 1, a, b), torch.mm(a.as_strided((3, 4), (1, 3)), b))
    bias, m, v = _g(4, 4), _g(8), _g(11)
    want = torch.addmm(bias, m.as_strided((4, 2), (2, 1)), v.as_strided((2, 4), (1, 2), 2))
    assert torch.equal(ext3(torch.addmm, 2, bias, m, v), want)


_PART = """
def call(args):
    x, w = args
    return (x * w, (x * w).sum())
"""


def _sig(n_inputs: int, grad_inputs: list[int]) -> dict:
    spec = '[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]'  # noqa: E501
    return {"n_out": 2, "mutated": [], "diff": [True, False], "grad_inputs": grad_inputs,
            "n_inputs": n_inputs, "outputs": [["graph", 0, [], [], 0, True, None],
                                              ["graph", 1, [], [], 0, False, None]],
            "out_spec": spec}


def test_autograd_program_inference_makes_no_autograd_function():
    ns = {"FILES": {}, "FILES_DIR": None}
    call = H.autograd_program(ns, _PART, "", _sig(2, []))
    assert not hasattr(call, "autograd_function")
    x, w = _g(3), _g(3)
    y, s = call([x, w])
    assert torch.equal(y, x * w) and torch.equal(s, (x * w).sum())


def test_autograd_program_training_runs_the_backward_part():
    # the forward part returns the two outputs and the activation it saves (x); the backward part
    # gets the saved activations, then the tangents of the differentiable outputs
    fw = "def call(args):\n    x, w = args\n    return (x * w, (x * w).sum().detach(), x)\n"
    bw = "def call(args):\n    x, g0 = args\n    return (g0 * x,)\n"
    call = H.autograd_program({"FILES": {}, "FILES_DIR": None}, fw, bw, _sig(2, [1]))
    assert issubclass(call.autograd_function, torch.autograd.Function)
    x, w = _g(3), _g(3).requires_grad_()
    y, s = call([x, w])
    assert y.requires_grad and not s.requires_grad
    (y * 2).sum().backward()
    torch.testing.assert_close(w.grad, 2 * x)
