"""max-autotune for kiln's generated Triton kernels.

The Triton code generator (codegen/triton) describes each kernel as a ``TritonKernel``: source with
``XBLOCK`` (and ``RBLOCK`` for row kernels) as constexprs, ``pointer_args`` then ``size_args``, an
``xnumel`` expression, the heuristic ``xblock``/``rblock``/``num_warps`` and a ``kind``
("pointwise", "persistent_reduction", "looped_reduction"). ``kernel_configs`` lists candidate
configurations around the heuristic one (which stays the default a candidate must beat);
``tune_kernel`` benchmarks them on copies of the buffers and returns the kernel with the winning
configuration (``dataclasses.replace``, so the wrapper's launch code picks it up unchanged).

Note: persistent reductions keep a whole row in one ``RBLOCK`` tile, so only ``XBLOCK`` and warps vary
for them. Stages vary only when the kernel description carries a ``num_stages`` field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from ..codegen.triton.kernel import size_arg_value
from ..codegen.triton.launcher import KilnLaunch, launch_context
from .cache import tune_key
from .compilers import CompileJob
from .config import Candidate, Choice, Config
from .session import Problem
from .tuner import Autotuner


class TritonKernelLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def pointer_args(self) -> tuple[str, ...]: ...
    @property
    def size_args(self) -> tuple[str, ...]: ...
    @property
    def xnumel(self) -> str: ...
    @property
    def xblock(self) -> int: ...
    @property
    def rblock(self) -> int: ...
    @property
    def num_warps(self) -> int: ...
    @property
    def kind(self) -> str: ...


K = TypeVar("K", bound=TritonKernelLike)


def _p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def default_config(k: TritonKernelLike) -> Config:
    consts = {"XBLOCK": k.xblock, **({"RBLOCK": k.rblock} if k.rblock else {})}
    return Config(tuple(sorted(consts.items())), k.num_warps, int(getattr(k, "num_stages", 1)))


def kernel_configs(k: TritonKernelLike, xnumel: int, limit: int = 24) -> list[Config]:
    """Candidate configurations for one generated kernel at this problem size; the default first."""
    stages = (1, 2, 3) if hasattr(k, "num_stages") and k.kind == "looped_reduction" else (
        (int(getattr(k, "num_stages", 1)),))
    xcap = max(1, _p2(xnumel))
    out = [default_config(k)]

    def add(warps: int, **consts: int) -> None:
        for s in stages:
            c = Config(tuple(sorted(consts.items())), warps, s)
            if c not in out:
                out.append(c)

    if k.kind == "pointwise":
        for xb in (128, 256, 512, 1024, 2048, 4096):
            xb = min(xb, max(16, xcap))
            for w in (1, 2, 4, 8):
                if xb // (32 * w) >= 1 and xb // (32 * w) <= 32:
                    add(w, XBLOCK=xb)
    elif k.kind == "persistent_reduction":
        for xb in (1, 2, 4, 8, 16, 32, 64):
            if xb > xcap or xb * k.rblock > 16384:
                continue
            for w in (1, 2, 4, 8, 16):
                if 32 * w <= max(32, xb * k.rblock // 2):
                    add(w, XBLOCK=xb, RBLOCK=k.rblock)
    else:  # looped reduction
        for rb in (64, 128, 256, 512, 1024, 2048):
            for xb in (1, 2, 4, 8, 16, 32, 64):
                if xb > xcap or not 256 <= xb * rb <= 8192:
                    continue
                for w in (2, 4, 8):
                    if 32 * w <= xb * rb // 4:
                        add(w, XBLOCK=xb, RBLOCK=rb)
    if limit <= 1:
        return out[:1]
    if len(out) > limit:  # keep the default and an even spread of the rest
        rest = out[1:]
        step = len(rest) / (limit - 1)
        out = [out[0], *(rest[int(i * step)] for i in range(limit - 1))]
    return out


def tune_kernel(k: TritonKernelLike, fn: Any, args: Sequence[Any], *, tuner: Autotuner,
                sizes: Mapping[str, int] | None = None, device_name: str | None = None,
                limit: int = 24) -> tuple[TritonKernelLike, Choice]:
    """Benchmark configurations of one kernel launched as ``fn[grid](*args, XBLOCK=..)`` and return the
    kernel description with the fastest. ``args`` are the launch arguments in order (tensors first,
    then size ints); tensors are copied so in-place kernels cannot corrupt the caller's data."""
    import triton

    env = dict(sizes or {})
    xnumel = int(eval(k.xnumel, {}, env)) if k.xnumel else 0  # noqa: S307 - the generator's own expression
    bench_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]

    def launch(c: Config) -> Any:
        grid = (triton.cdiv(xnumel, c.get("XBLOCK", 1)), 1, 1)
        return lambda: fn[grid](*bench_args, **dict(c.constants), num_warps=c.num_warps,
                                num_stages=c.num_stages)

    configs = kernel_configs(k, xnumel, limit)
    cands = [Candidate(c, launch(c), is_default=(i == 0)) for i, c in enumerate(configs)]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = device_name or (torch.cuda.get_device_name(tensors[0].device)
                             if tensors and tensors[0].is_cuda else "cpu")
    key = tune_key(k.source, device, (xnumel, *(env.get(s) for s in k.size_args)),
                   [t.dtype for t in tensors])
    choice = tuner.select(k.name, key, cands)
    return apply_config(k, choice.config), choice


def apply_config(k: K, c: Config) -> K:
    changes: dict[str, int] = {"xblock": c.get("XBLOCK", k.xblock), "num_warps": c.num_warps}
    if k.rblock:
        changes["rblock"] = c.get("RBLOCK", k.rblock)
    if hasattr(k, "num_stages"):
        changes["num_stages"] = c.num_stages
    return dataclasses.replace(k, **changes)  # type: ignore[type-var]


def tune_program(kernels: Any, buffers: Mapping[str, torch.Tensor], sizes: Mapping[str, int] | None, *,
                 tuner: Autotuner) -> list[Any]:
    """Tune every kernel of a ``codegen.triton.wrapper.TritonKernels`` (``.generated``, ``.module``)
    on ``buffers`` (name -> tensor, each its whole storage); returns the tuned kernel descriptions."""
    env = dict(sizes or {})
    tuned = []
    for k in kernels.generated:
        fn = getattr(kernels.module, k.name)
        args = [buffers[b] for b in k.pointer_args] + [size_arg_value(s, env[s]) for s in k.size_args]
        new_k, _ = tune_kernel(k, fn, args, tuner=tuner, sizes=env)
        tuned.append(new_k)
    return tuned


def buffers_for(layouts: Mapping[str, Any], sizes: Mapping[str, int] | None,
                device: torch.device | str) -> dict[str, torch.Tensor]:
    """Tuning buffers for a program's layouts (``ir.Layout``: sympy shape/stride/offset, dtype): each a
    flat tensor covering the layout's whole extent, size symbols bound from ``sizes``."""
    env = dict(sizes or {})

    def value(e: Any) -> int:
        if isinstance(e, int):
            return e
        subs = {sym: env[sym.name] for sym in e.free_symbols if sym.name in env}
        return int(e.subs(subs))

    out = {}
    for name, layout in layouts.items():
        dims = [(value(n), value(st)) for n, st in zip(layout.shape, layout.stride)]
        extent = 0 if any(n == 0 for n, _ in dims) else 1 + sum((n - 1) * st for n, st in dims)
        out[name] = random_buffer(value(layout.offset) + extent, layout.dtype, device)
    return out


def random_buffer(numel: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A buffer to tune on: normal floats; zeros for integers and bools (valid as gather indices)."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(numel, device=device).to(dtype)
    return torch.zeros(numel, dtype=dtype, device=device)


_DEF = re.compile(r"def\s+(\w+)\s*\(([^)]*)\)")


def normalized_source(source: str) -> str:
    """``source`` with its function name and parameters renamed by position and comment lines dropped:
    kernels that differ only in buffer names (the same layer, twelve times) normalise alike."""
    m = _DEF.search(source)
    if m is None:
        return source
    params = [p.split(":")[0].split("=")[0].strip() for p in m.group(2).split(",") if p.strip()]
    renames = {m.group(1): "KERNEL", **{p: f"arg{i}" for i, p in enumerate(params)}}
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in renames) + r")\b")
    lines = (ln for ln in source.splitlines() if not ln.lstrip().startswith("#"))
    return pattern.sub(lambda x: renames[x.group(1)], "\n".join(lines))


def kernel_problem(k: TritonKernelLike, fn: Callable[[], Any], dtypes: Sequence[torch.dtype],
                   buffers: Callable[[], Sequence[torch.Tensor]], device_name: str, limit: int) -> Problem:
    """The tuning problem of one generated kernel with static sizes and no size arguments: its
    configurations (the heuristic one first), launches through the wrapper's fast launcher on
    ``buffers()`` (made on first use), and a compile job per configuration. ``fn()`` gives the
    triton function (its module loads on first use: a cache hit needs none)."""
    xnumel = int(eval(k.xnumel, {}, {})) if k.xnumel else 0  # noqa: S307 - the generator's own literal
    configs = kernel_configs(k, xnumel, limit)
    key = tune_key("kiln kernel v2\n" + normalized_source(k.source), device_name, (xnumel,), list(dtypes))

    def launch(c: Config) -> Callable[[], object]:
        run = None

        def go() -> object:
            nonlocal run
            if run is None:
                run = KilnLaunch(fn(), dict(c.constants), c.num_warps, None, c.num_stages)
            grid = (-(-xnumel // c.get("XBLOCK", 1)), 1, 1)
            return run(grid, launch_context(), *buffers())
        return go

    def jobs() -> list[CompileJob]:
        f = fn()
        return [CompileJob(f, tuple(dtypes), c.constants, c.num_warps, c.num_stages, f"{k.name} {c.label}")
                for c in configs]

    return Problem(k.name, key, "kernel", configs, launch, jobs)
