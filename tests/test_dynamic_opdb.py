"""op_db samples with dim 0 of the input marked dynamic, through capture + kiln.autograd + kiln.decomp's
inductor table (the ATen graphs run as they are): forward and backward against eager at the sample's
size and at sizes one smaller and one larger served by the same compiled graph where possible.

This checks the decompositions on symbolic sizes (no ``int()`` of a size, size-oblivious branches):
a decomposition that read a size as an int would specialise the graph (a guard ``s0 == 5``), and the
count of samples served symbolically would drop (``test_most_samples_stay_symbolic``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten

import kiln
import kiln.autograd as ka
import kiln.capture as kc
from kiln.decomp import table
from kiln.decomp.opinfo_check import opinfo_id, selected_opinfos

# test_most_samples_stay_symbolic reads SYMBOLIC, which the op_db tests fill in this process: the whole
# file runs on one xdist worker (split, the count would skip).
pytestmark = pytest.mark.xdist_group("tests/test_dynamic_opdb.py")

OPINFOS = selected_opinfos()
TABLE = table("inductor")
SYMBOLIC: dict[str, bool] = {}


def _backend(gm: Any, example_inputs: Sequence[Any]) -> Any:
    return ka.aot(gm, example_inputs, fw_compiler=ka.run_graph_compiler, decompositions=TABLE)


def _resized(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` with ``n`` rows along dim 0 (cut, or grown by repeating the first rows)."""
    base = x.detach()
    while base.shape[0] < n:
        base = torch.cat([base, base[: n - base.shape[0]]])
    out = base[:n].clone()
    return out.requires_grad_(x.requires_grad)


def _clone(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(v.requires_grad)
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    return v


def _run(op: Any, inp: torch.Tensor, args: tuple, kwargs: dict) -> tuple[list[Any], list[Any]]:
    out = op(inp, *args, **kwargs)
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    diff = [o for o in outs if o.requires_grad and o.dtype.is_floating_point]
    leaves = [t for t in tree_flatten((inp, args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    grads: list[Any] = []
    if diff and leaves:
        g = torch.Generator().manual_seed(3)
        cot = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in diff]
        grads = list(torch.autograd.grad(diff, leaves, cot, allow_unused=True))
    return [o.detach() for o in outs], grads


def _compare(a: list[Any], b: list[Any], what: str) -> None:
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None, what
            continue
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("opinfo", OPINFOS, ids=opinfo_id)
def test_sample_with_dynamic_dim(opinfo: Any) -> None:
    samples = [s for s in opinfo.sample_inputs("cpu", torch.float32, requires_grad=opinfo.supports_autograd)
               if isinstance(s.input, torch.Tensor) and s.input.dim() >= 1 and s.input.shape[0] >= 3]
    if not samples:
        pytest.skip("no sample with a dim 0 of size >= 3")
    sample = samples[0]
    kiln.reset()

    def fn(inp: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        return opinfo.op(inp, *args, **kwargs)
    compiled = kiln.compile(fn, backend=_backend)

    def call(inp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return compiled(inp, args, kwargs)
    n = sample.input.shape[0]
    for size in (n, n - 1, n + 1):
        inp = _resized(sample.input, size)
        kiln.mark_dynamic(inp, 0)
        args, kwargs = _clone(tuple(sample.args)), _clone(dict(sample.kwargs))
        try:
            expected = _run(opinfo.op, _clone(inp), _clone(args), _clone(kwargs))
        except Exception:  # eager refuses this size (a size-matched argument): so must the compiled code
            with pytest.raises(Exception):  # noqa: B017
                _run(call, inp, args, kwargs)
            continue
        got = _run(call, inp, args, kwargs)
        if "empty" in opinfo.name:  # values unspecified: shapes and dtypes only
            got, expected = (([o.new_zeros(o.shape) for o in r[0]], r[1]) for r in (got, expected))
        _compare(got[0], expected[0], f"{opinfo_id(opinfo)} size {size} outputs")
        _compare(got[1], expected[1], f"{opinfo_id(opinfo)} size {size} gradients")
    entries = kc.cache_entries(compiled._optimized)
    SYMBOLIC[opinfo_id(opinfo)] = any(g.kind == "SYMBOL" for e in entries for g in e.guards) and len(entries) == 1


def test_most_samples_stay_symbolic() -> None:
    if len(SYMBOLIC) < len(OPINFOS) // 2:
        pytest.skip("run together with the op_db tests of this module")
    served = sorted(k for k, v in SYMBOLIC.items() if v)
    print(f"op_db samples served by one symbolic graph: {len(served)} of {len(SYMBOLIC)}; not: "
          f"{sorted(k for k, v in SYMBOLIC.items() if not v)}")
    # measured 158 of 167 (chunk, split, unbind... return as many tensors as the size says: specialised)
    assert len(served) >= 0.9 * len(SYMBOLIC), (len(served), len(SYMBOLIC),
                                                sorted(k for k, v in SYMBOLIC.items() if not v))
