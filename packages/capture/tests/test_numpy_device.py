"""NumPy code under ``with torch.device(d)``: arrays live on d while traced (ndarray inputs and
``x.numpy()`` moved in the graph, constructors made there, in-place writes copied back to the CPU
memory they came from), results come back as CPU ndarrays equal to NumPy's. On CPU: the meta device
shows the placement in the captured graph, and a ``torch.device("cpu")`` context changes nothing;
the CUDA tests (marked ``gpu``) run the same programs on the GPU."""

import copy

import numpy as np
import pytest
import torch

import kiln.capture as kc

from .conftest import Recorder, assert_same


def arith(a, b):
    c = np.zeros((3, 4)) + a * 2 + np.arange(4) + np.full((3, 4), 0.5, dtype=np.float32)
    return np.sin(c) + b.sum(axis=0), c.mean(), np.linspace(0.0, 1.0, 4) @ c.T


def writes_input(a):
    a[0] += 1.0
    v = a[1]
    v *= 2  # through a view of the input
    return a


def writes_tensor(x):
    y = x.numpy()
    y += 1
    return np.fft.rfft(y), np.random.rand(3)


def returns_view(a):
    return a[1:] * 1.0, a.T


def _arrays():
    return (np.random.rand(3, 4), np.random.rand(2, 4))


def _run_repeated(fn, make, device, calls=3):
    kc.reset()
    rec = Recorder()
    opt = kc.optimize(fn, rec)
    for i in range(calls):
        args = make()  # CPU arrays and tensors, made outside the context
        eager_args = copy.deepcopy(args)
        with torch.device(device):
            np.random.seed(i)
            want = fn(*eager_args)
            np.random.seed(i)
            got = opt(*args)
        assert_same(got, want)
        assert_same(args, eager_args)  # in-place writes reached the caller's arrays and tensors
    return opt, rec, args


def test_meta_device_places_every_array_op_there():
    with torch.device("meta"):
        cg = kc.capture_graph(arith, _arrays(), {})
    devices = {n.meta["val"].device.type for n in cg.gm.graph.nodes
               if n.op in ("call_function", "call_method") and isinstance(n.meta.get("val"), torch.Tensor)}
    assert devices == {"meta"}, cg.as_text()
    assert cg.as_text().count(".to(%import_torch_from_numpy_l_") == 2  # the two ndarray inputs, moved in the graph


def test_meta_device_writes_are_copied_back():
    x = torch.ones(3, 4)  # a CPU tensor, made outside the context
    with torch.device("meta"):
        text = kc.capture_graph(writes_input, (np.ones((3, 4)),), {}).as_text()
        text2 = kc.capture_graph(writes_tensor, (x,), {}).as_text()
    assert ".copy_(%import_torch_from_numpy_l_a, %to)" in text, text
    assert ".copy_(%l_x," in text2 and "random.mtrand._rand.rand(3)" in text2, text2


def test_no_write_no_copy_back():
    with torch.device("meta"):
        text = kc.capture_graph(arith, _arrays(), {}).as_text()
    assert "copy_" not in text


@pytest.mark.parametrize("fn, make", [(arith, _arrays), (writes_input, lambda: (np.random.rand(3, 4),)),
                                      (writes_tensor, lambda: (torch.randn(3, 4),))])
def test_cpu_device_context_is_plain_numpy(fn, make):
    _, rec, _ = _run_repeated(fn, make, "cpu")
    assert rec.count == 1
    args = make()
    with torch.device("cpu"):
        assert "device(type=" not in kc.capture_graph(fn, args, {}).as_text()


@pytest.mark.parametrize("fn, make", [(arith, _arrays), (writes_input, lambda: (np.random.rand(3, 4),)),
                                      (writes_tensor, lambda: (torch.randn(3, 4),))])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_context(fn, make):
    _, rec, _ = _run_repeated(fn, make, "cuda")
    assert rec.count == 1
    ops = [n for n in rec.graphs[0].graph.nodes if n.op in ("call_function", "call_method")
           and isinstance(n.meta.get("val"), torch.Tensor) and n.target != "copy_"]
    assert ops and all(n.meta["val"].device.type == "cuda" for n in ops), rec.graphs[0].graph


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_input_returned_unchanged_is_the_same_object():
    def f(a):
        return a, a.sum()
    kc.reset()
    opt = kc.optimize(f, Recorder())
    with torch.device("cuda"):
        for _ in range(3):
            a = np.random.rand(5)
            got = opt(a)
            assert got[0] is a and isinstance(got[1], np.float64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_view_of_an_input_leaving_the_graph_runs_eagerly():
    kc.reset()
    a = np.random.rand(3, 4)
    with torch.device("cuda"):
        ex = kc.explain(returns_view)(a)
        assert ex.eager_frames and "view of a numpy array" in ex.eager_frames[0].reason, ex.as_text()
        opt = kc.optimize(returns_view, Recorder())
        got = opt(a)
        assert np.shares_memory(got[1], a)  # eager's aliasing, kept
