"""Cross-reference checking: run real code and compare each decomposed op with eager, op by op.

``CrossRefMode`` is a TorchDispatchMode over real tensors. For every ATen call that has a rule in the
table it runs the rule to its fixpoint (``EagerDecomposeMode``) on copies of the arguments, runs the
op itself, and compares outputs (and mutated arguments) within dtype-aware tolerances. Forward and
backward ops are both seen when autograd runs under the mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .registry import op_name

aten = torch.ops.aten

# Outputs with unspecified or random values: only metadata (shape, dtype) is compared.
VALUES_UNSPECIFIED: frozenset[OpOverload] = frozenset({
    aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default,
    aten.rand_like.default, aten.randn_like.default, aten.bernoulli.default, aten.native_dropout.default,
    aten.rand.default, aten.randn.default, aten.randint.low, aten.bernoulli.p, aten.empty.memory_format,
    aten.empty_strided.default,
})

# Attention kernels also return RNG seeds/offsets and workspace sizes: only floating outputs compare.
FLOAT_OUTPUTS_ONLY: frozenset[str] = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
})

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # (rtol, atol)
    torch.float64: (1e-6, 1e-7),
    torch.float32: (1.3e-4, 1e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (3e-3, 3e-3),
}


class EagerDecomposeMode(TorchDispatchMode):
    """Applies a table's rules recursively on real tensors (ops without a rule run eagerly)."""

    def __init__(self, table: Mapping[OpOverload, Callable[..., Any]]) -> None:
        super().__init__()
        self.table = table

    def __torch_dispatch__(self, func: OpOverload, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        fn = self.table.get(func)
        if fn is not None:
            with self:
                out = fn(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


@dataclass
class CrossRefReport:
    checked: dict[str, int] = field(default_factory=dict)  # op name -> number of calls that matched
    failures: list[str] = field(default_factory=list)


def _clone(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


def _compare(name: str, expected: Any, got: Any, values: bool, floats_only: bool = False) -> str | None:
    exp_flat, _ = tree_flatten(expected)
    got_flat, _ = tree_flatten(got)
    if len(exp_flat) != len(got_flat):
        return f"{name}: {len(got_flat)} outputs, expected {len(exp_flat)}"
    for i, (e, g) in enumerate(zip(exp_flat, got_flat)):
        if not isinstance(e, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor):
            return f"{name} output {i}: got {type(g).__name__}, expected a tensor"
        if e.shape != g.shape or e.dtype != g.dtype:
            return f"{name} output {i}: got {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
        if not values or e.numel() == 0 or (floats_only and not e.dtype.is_floating_point):
            continue
        rtol, atol = TOLERANCES.get(e.dtype, (0.0, 0.0))
        try:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
        except AssertionError as err:
            return f"{name} output {i}: {str(err).splitlines()[0]} | {' '.join(str(err).split())[:300]}"
    return None


class CrossRefMode(TorchDispatchMode):
    """Compares every op that ``table`` decomposes with eager, recording results in ``report``."""

    def __init__(self, table: Mapping[OpOverload, Callable[..., Any]], report: CrossRefReport | None = None) -> None:
        super().__init__()
        self.table = table
        self.report = report or CrossRefReport()

    def __torch_dispatch__(self, func: OpOverload, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in self.table:
            return func(*args, **kwargs)
        return self.check(func, tuple(args), kwargs)

    def check(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Compare ``table[func]`` with ``func`` on these arguments (also for composite ops, which
        never reach a dispatch mode); returns eager's result."""
        name = op_name(func)
        c_args, c_kwargs = tree_map(_clone, (args, kwargs))
        try:
            with EagerDecomposeMode(self.table):
                got = self.table[func](*c_args, **c_kwargs)
        except Exception as e:  # a rule that raises is a failure, not a crash of the test run
            got = e
        expected = func(*args, **kwargs)
        if got is NotImplemented:
            return expected
        if isinstance(got, Exception):
            self.report.failures.append(f"{name}: raised {type(got).__name__}: {got}")
            return expected
        why = _compare(name, expected, got, func not in VALUES_UNSPECIFIED,
                       func._schema.name.split("::")[-1] in FLOAT_OUTPUTS_ONLY)
        if why is None:
            why = self._compare_mutations(func, name, args, c_args)
        if why is None:
            self.report.checked[name] = self.report.checked.get(name, 0) + 1
        else:
            self.report.failures.append(why)
        return expected

    @staticmethod
    def _compare_mutations(func: OpOverload, name: str, args: Any, c_args: Any) -> str | None:
        for i, a in enumerate(func._schema.arguments[: len(args)]):
            if a.alias_info is not None and a.alias_info.is_write and isinstance(args[i], torch.Tensor):
                why = _compare(f"{name} (mutated {a.name})", args[i], c_args[i], True)
                if why:
                    return why
        return None
