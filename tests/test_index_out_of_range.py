"""An index out of range in compiled code raises IndexError where eager raises (C++ kernels check every
index they load from a tensor), never reads or writes outside the tensor; in-range indices, negative
ones where the op takes them, give eager's values; a call after the error runs normally."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln


def _embedding(w, idx):
    return F.embedding(idx, w) * 2


def _index(w, idx):
    return w[idx] + 1


def _index_select(w, idx):
    return torch.index_select(w, 0, idx).sum(1)


def _gather(w, idx):
    return torch.gather(w, 0, idx.unsqueeze(1).expand(-1, w.shape[1])) * 3


def _scatter_add(w, idx):
    return torch.zeros_like(w).scatter_add(0, idx.unsqueeze(1).expand(-1, w.shape[1]), torch.ones(idx.shape[0], w.shape[1]))


def _index_add(w, idx):
    return w.index_add(0, idx, torch.ones(idx.shape[0], w.shape[1]))


def _index_put(w, idx):
    y = w.clone()
    y.index_put_((idx,), torch.ones(idx.shape[0], w.shape[1]), accumulate=True)
    return y


# (program, whether eager takes negative indices: counted from the end)
PROGRAMS = [(_embedding, False), (_index, True), (_index_select, False), (_gather, False), (_scatter_add, False),
            (_index_add, False), (_index_put, True)]


@pytest.mark.parametrize("fn, negative", PROGRAMS, ids=[p.__name__.strip("_") for p, _ in PROGRAMS])
def test_out_of_range_index_raises_as_eager_and_in_range_ones_match(fn, negative):
    kiln.reset()
    compiled = kiln.compile(fn)
    w = torch.randn(6, 4)
    low = -6 if negative else 0
    for _ in range(2):  # fresh indices each call
        idx = torch.randint(low, 6, (5,))
        torch.testing.assert_close(compiled(w, idx), fn(w, idx))
    bad_ones = [torch.tensor([0, 6, 1, 2, 3]), torch.tensor([1, 2, -7, 0, 0])]
    if not negative and fn is not _index_add:  # (index_add's decomposition takes -1: see below)
        bad_ones.append(torch.tensor([1, -1, 0, 0, 0]))
    for bad in bad_ones:
        with pytest.raises((IndexError, RuntimeError)):
            fn(w, bad)
        with pytest.raises(IndexError, match="out of bounds"):
            compiled(w, bad)
    idx = torch.tensor([5, low, 0, 2, 2])
    torch.testing.assert_close(compiled(w, idx), fn(w, idx))  # nothing left over from the error


def test_index_add_takes_a_negative_index_where_eager_refuses_it():
    """Known difference: ``index_add`` (and ``index_copy``) decompose into ``index_put``, which counts a
    negative index from the end; eager's ``index_add`` refuses it. Out-of-range indices raise in both."""
    compiled = kiln.compile(_index_add)
    w, idx = torch.randn(6, 4), torch.tensor([-1, 0])
    with pytest.raises(RuntimeError):
        _index_add(w, idx)
    torch.testing.assert_close(compiled(w, idx), _index_add(w, torch.tensor([5, 0])))


def test_the_cpp_wrapper_raises_too():
    kiln.reset()
    compiled = kiln.compile(_embedding, options={"wrapper": "cpp"})
    w, idx = torch.randn(6, 4), torch.tensor([1, 5, 0])
    torch.testing.assert_close(compiled(w, idx), _embedding(w, idx))
    with pytest.raises(Exception, match="index 9 is out of bounds"):
        compiled(w, torch.tensor([1, 9, 0]))
    torch.testing.assert_close(compiled(w, idx), _embedding(w, idx))
