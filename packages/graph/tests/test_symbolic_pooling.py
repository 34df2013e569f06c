"""Pooled sizes over symbolic dims without a parity guard (kiln.graph.symbolic_dispatch).

torch 2.11's pooling meta kernels divide with ``div_rtn``, whose ``r != 0`` test on SymInts guards the
parity of the size; on the H200 (torch 2.11) a ResNet's max pool recorded ``(((H + 1) // 2) + 1) % 2 != 0``
and kiln.export refused every range of image sizes. These tests install that ``div_rtn`` (whatever torch
runs here) and check that a symbolic trace records no guard, on fake CPU and CUDA tensors, and that the
helper swapped in computes what torch's did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch._meta_registrations as torch_meta
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.graph import symbolic_dispatch
from kiln.graph.symbolic import floored_pooling_sizes


def div_rtn_2_11(x, y):  # type: ignore[no-untyped-def]
    """torch 2.11's ``torch._meta_registrations.div_rtn``."""
    q = x // y
    r = x % y
    if r != 0 and (bool(r < 0) != bool(y < 0)):
        q -= 1
    return q


@pytest.fixture
def torch_2_11_pooling(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch_meta, "div_rtn", div_rtn_2_11)
    yield


def pooled_stem(device: str, dispatch: bool) -> tuple[torch.Size, list[str]]:
    """A stride-2 convolution and ResNet's max pool (3, 2, 1) over an image whose height and width are
    symbols (64 when traced): the output's size and the ShapeEnv's guards."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, DimDynamic.STATIC, DimDynamic.DYNAMIC,
                                                  DimDynamic.DYNAMIC])
    x = mode.from_tensor(torch.empty(2, 3, 64, 64), symbolic_context=ctx)
    with mode, (symbolic_dispatch(True) if dispatch else contextlib.nullcontext()):
        x = torch.empty(x.shape, device=device)
        w = torch.empty(8, 3, 7, 7, device=device)
        y = F.max_pool2d(F.conv2d(x, w, stride=2, padding=3), 3, 2, 1)
    return y.shape, [str(g.expr) for g in env.guards if "Mod" in str(g.expr) or "%" in str(g.expr)]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_symbolic_trace_records_no_parity_guard(device: str, torch_2_11_pooling: None) -> None:
    if device == "cuda" and not torch.backends.cuda.is_built():
        pytest.skip("fake CUDA tensors need a CUDA build of torch")
    shape, parity = pooled_stem(device, dispatch=False)
    assert parity, "torch 2.11's div_rtn no longer guards: this test reproduces nothing"
    shape, parity = pooled_stem(device, dispatch=True)
    assert not parity
    assert str(shape[2]) != str(shape[3]) and all(isinstance(s, torch.SymInt) for s in shape[2:])
    assert torch_meta.div_rtn is div_rtn_2_11  # swapped back on exit


def test_floor_division_is_torchs_div_rtn() -> None:
    """The helper swapped in computes div_rtn's value for every int (and so for every size)."""
    with floored_pooling_sizes():
        floor = torch_meta.div_rtn
    assert floor is not div_rtn_2_11 and torch_meta.div_rtn is not floor
    for x in range(-40, 41):
        for y in (-7, -3, -2, -1, 1, 2, 3, 5):
            assert floor(x, y) == div_rtn_2_11(x, y), (x, y)


def test_nested_swaps_restore_torchs_helper() -> None:
    before = torch_meta.div_rtn
    with floored_pooling_sizes():
        inner = torch_meta.div_rtn
        with floored_pooling_sizes():
            assert torch_meta.div_rtn is inner
        assert torch_meta.div_rtn is inner  # the outer trace still runs
    assert torch_meta.div_rtn is before
