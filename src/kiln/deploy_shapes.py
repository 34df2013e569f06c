"""Dynamic shapes for kiln.export: ``dynamic_shapes`` checked and marked on the inputs, each size
symbol of the capture with the input dim it is read from and its range (``SizeSymbol``), and the
checks that the program serves what was asked (no dim fixed, no range narrowed, symbolic inputs
contiguous)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

import kiln.capture as capture
from kiln.graph import CapturedGraph, KilnError, TensorSpec
from kiln.inductor import DynamicShapeUnsupported, guard_text


class ExportError(KilnError):
    """The program cannot be exported as one inference graph (the message says why and where)."""


@dataclass(frozen=True)
class SizeSymbol:
    """A dim the exported program serves for every size in [min, max]: read from the caller's input
    ``input`` (its position among the inputs), dim ``dim``."""

    symbol: str  # the size symbol the graph and the generated code name it by
    input: int
    dim: int
    min: int
    max: int


def dynamic_dims(dynamic_shapes: Mapping[str, Any] | None, leaves: list[tuple[str, str, torch.Tensor]],
                  name: str) -> dict[int, dict[int, tuple[int, int]]]:
    """``dynamic_shapes`` checked, by input position: {input: {dim: (min, max)}}."""
    if not dynamic_shapes:
        return {}
    where = f"kiln.export({name}, dynamic_shapes=...)"
    names = {n: k for k, (_, n, _) in enumerate(leaves)}
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for key, dims in dict(dynamic_shapes).items():
        if key not in names:
            raise ExportError(f"{where}: {key!r} is not a tensor input of the call; its tensor inputs are "
                              f"{', '.join(repr(n) for n in names) or 'none'}")
        t = leaves[names[key]][2]
        for d, rng in dict(dims or {}).items():
            if not isinstance(d, int) or not -t.dim() <= d < t.dim():
                raise ExportError(f"{where}: input {key!r} has {t.dim()} dims; dim {d!r} does not exist")
            if (not isinstance(rng, (tuple, list)) or len(rng) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng)):
                raise ExportError(f"{where}: input {key!r} dim {d}: expected a range (min, max) of two ints, "
                                  f"got {rng!r}")
            lo, hi = rng
            if lo < 2 or hi < lo:
                raise ExportError(f"{where}: input {key!r} dim {d} in range {tuple(rng)}: a dynamic size ranges "
                                  "over 2 <= min <= max (sizes 0 and 1 are specialised: a size-1 dim broadcasts); "
                                  "export size 1 separately")
            size = int(t.shape[d])
            if not lo <= size <= hi:
                raise ExportError(f"{where}: input {key!r} dim {d} is {size} in the example, outside its range "
                                  f"{tuple(rng)}; export with an example inside the range")
            out.setdefault(names[key], {})[d % t.dim()] = (lo, hi)
    return out


def marked(args: tuple, kwargs: dict, leaves: list[tuple[str, str, torch.Tensor]],
            dynamic: dict[int, dict[int, tuple[int, int]]]) -> tuple[tuple, dict]:
    """The call's arguments with each dynamic input replaced by a contiguous alias marked dynamic over
    its ranges (the caller's tensors are left as they are; a runner makes its inputs contiguous)."""
    aliases: dict[int, torch.Tensor] = {}
    for k, dims in dynamic.items():
        t = leaves[k][2]
        alias = t.detach().contiguous()
        for d, (lo, hi) in dims.items():
            capture.mark_dynamic(alias, d, min=lo, max=hi)
        aliases[id(t)] = alias
    args, kwargs = pytree.tree_map(lambda v: aliases.get(id(v), v) if isinstance(v, torch.Tensor) else v,
                                   (args, kwargs))
    return tuple(args), dict(kwargs)


_SIZE_SOURCE = re.compile(r"^(.*)\.size\(\)\[(\d+)\]$")
_STRIDE_SOURCE = re.compile(r"^(.*)\.stride\(\)\[(\d+)\]$")


def check_asked(captured: CapturedGraph, leaves: list[tuple[str, str, torch.Tensor]],
                 dynamic: dict[int, dict[int, tuple[int, int]]], name: str) -> None:
    """Every dim asked to vary is still a size symbol after capture (the program did not fix it)."""
    specs = traced_specs(captured)
    for k, dims in dynamic.items():
        src, display, _ = leaves[k]
        spec = specs.get(src)
        if spec is None:
            continue  # the program does not read this input: any size does
        for d, rng in dims.items():
            if not getattr(spec.shape[d], "free_symbols", None):  # a symbol, or an expression over others
                raise ExportError(f"kiln.export({name}): input {display!r} dim {d} was asked to vary in {rng}, but "
                                  f"the program fixes it to {spec.shape[d]} (it relates the size to a static one); "
                                  "leave it out of dynamic_shapes or change the program")


def size_symbols(captured: CapturedGraph, leaves: list[tuple[str, str, torch.Tensor]],
                  name: str) -> tuple[SizeSymbol, ...]:
    """Every size symbol of the capture (dynamic_shapes, or dims marked with kiln.mark_dynamic) with
    the input dim it is read from and its range. An input with symbolic dims must be contiguous (the
    runners make their inputs so)."""
    position = {src: k for k, (src, _, _) in enumerate(leaves)}
    ranges = symbol_ranges(captured)
    out: dict[str, SizeSymbol] = {}
    for g in captured.guards:
        if g.kind != "SYMBOL" or str(g.expected) in out:
            continue
        if _STRIDE_SOURCE.match(g.source):
            continue  # a stride expression's name (``stride0 == 3*s1*s2``): inputs are contiguous here
        m = _SIZE_SOURCE.match(g.source)
        if m is None or m.group(1) not in position:
            raise ExportError(f"kiln.export({name}): size symbol {g.expected} comes from {g.source}, not a dim of an "
                              "input; export with dynamic_shapes over the inputs' dims only")
        sym, k, d = str(g.expected), position[m.group(1)], int(m.group(2))
        # the range asked for (dynamic_shapes or mark_dynamic; sizes 0 and 1 are never symbolic), else
        # the ShapeEnv's; check_ranges refuses a program that serves less
        asked = getattr(leaves[k][2], "_kiln_dynamic_ranges", {}).get(d, (None, None))
        lo, hi = ranges.get(sym, (None, None))
        lo = lo if asked[0] is None else max(asked[0], 2)
        hi = hi if asked[1] is None else asked[1]
        if lo is None or hi is None:
            raise ExportError(f"kiln.export({name}): size symbol {sym} ({g.source}) has no finite range; give "
                              "every dynamic dim a (min, max) in dynamic_shapes")
        out[sym] = SizeSymbol(sym, k, d, lo, hi)
    if out:
        for src, spec in traced_specs(captured).items():
            if src in position and spec.is_dynamic and not _contiguous(spec):
                raise ExportError(f"kiln.export({name}): input {leaves[position[src]][1]!r} has symbolic sizes and "
                                  f"strides {spec.stride}, not contiguous ones; pass a contiguous example (or mark "
                                  "it through dynamic_shapes, which does)")
    return tuple(out.values())


def check_ranges(captured: CapturedGraph, sizes: Sequence[SizeSymbol], describe: Callable[[SizeSymbol], str],
                 where: str) -> None:
    """Each size symbol still ranges over what was asked: a step that assumed a narrower range (a branch
    on the size, a shape rule comparing it with a constant, or an inequality over a size derived from it:
    a convolution's output size that must not be 1) is an error naming the relations, not a package that
    serves fewer sizes than asked. (Equalities over one size, a reshape's divisibility, are relations
    of the program that the runners check per call.)"""
    now = symbol_ranges(captured)
    relations = _relations(captured)
    for z in sizes:
        lo, hi = now.get(z.symbol, (z.min, z.max))
        if (lo, hi) == (z.min, z.max):
            _check_range_ends(z, relations, describe, where)
            continue
        said = ", ".join(_said(r) for r in relations if z.symbol in {str(x) for x in r.free_symbols})
        raise ExportError(f"{where}: {describe(z)} was to vary in [{z.min}, {z.max}], but the program was traced "
                          f"or compiled for [{lo}, {hi}] only (it assumed {said or 'a narrower range'}); export a "
                          "narrower range, or that dim static")


def _check_range_ends(z: SizeSymbol, relations: list[sympy.Basic], describe: Callable[[SizeSymbol], str],
                      where: str) -> None:
    """The inequalities over ``z`` alone hold at both ends of its range."""
    for r in relations:
        if isinstance(r, sympy.Eq) or {str(x) for x in r.free_symbols} != {z.symbol}:
            continue
        (sym,) = r.free_symbols
        for end in (z.min, z.max):
            if r.subs(sym, end) is sympy.false:
                raise ExportError(f"{where}: {describe(z)} was to vary in [{z.min}, {z.max}], but the program was "
                                  f"traced or compiled assuming {_said(r)}, which fails at size {end} (a size "
                                  "computed from it changes how the program runs there, e.g. becomes 1); export a "
                                  f"range without {end}, or that dim static")


def _said(relation: sympy.Basic) -> str:
    """A relation as the manifest and model.so's errors print it (kiln.inductor's printer)."""
    try:
        return guard_text(relation)
    except DynamicShapeUnsupported:  # no form over kiln's sizes (kiln.package refuses it): torch's text
        return str(relation)


def _relations(captured: CapturedGraph) -> list[sympy.Basic]:
    """The relations the capture's ShapeEnv holds (its guards: capture's, the trace's, the compile's)."""
    env = _shape_env(captured)
    return list(dict.fromkeys(g.expr for g in env.guards)) if env is not None else []


def _shape_env(captured: CapturedGraph) -> Any:
    for n in captured.gm.graph.nodes:
        v = n.meta.get("val") if n.op == "placeholder" else None
        sizes = [*v.shape, *v.stride()] if isinstance(v, torch.Tensor) else [v]
        env = next((s.node.shape_env for s in sizes if isinstance(s, torch.SymInt)), None)
        if env is not None:
            return env
    return None


def _contiguous(spec: TensorSpec) -> bool:
    want: Any = 1
    for n, st in zip(reversed(spec.shape), reversed(spec.stride)):
        if n != 1 and sympy.expand(sympy.sympify(st) - want) != 0:
            return False
        want = want * n
    return True


def traced_specs(captured: CapturedGraph) -> dict[str, TensorSpec]:
    """Each tensor input's spec as the capture left it (a symbol the trace related to another, or
    fixed, is written as what it became), by source."""
    vals = [n.meta.get("val") for n in captured.gm.graph.nodes if n.op == "placeholder"]
    return {src: TensorSpec.from_tensor(v) for src, v in zip(captured.input_sources, vals)
            if isinstance(v, torch.Tensor)}


def symbol_ranges(captured: CapturedGraph) -> dict[str, tuple[int | None, int | None]]:
    """The ShapeEnv's range of each size symbol, by name (None: unbounded)."""
    env = _shape_env(captured)
    if env is None:
        return {}
    return {str(k): (_bound(r.lower), _bound(r.upper)) for k, r in env.var_to_range.items()}


def _bound(b: Any) -> int | None:
    try:
        return int(b)
    except (TypeError, ValueError, OverflowError, AttributeError):  # int_oo, -int_oo
        return None
