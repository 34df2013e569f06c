"""``kiln.compile`` and friends: torch.compile's user surface over kiln's stages."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import kiln.capture as capture
import kiln.runtime as runtime
from kiln import aot
from kiln.backends import resolve_backend
from kiln.graph import Backend
from kiln.report import report_from_env
from kiln.runtime import native_guards
from kiln.settings import CompileOptions

report_from_env()  # KILN_REPORT=dir: this process's compile report, written at exit


def compile(
    fn_or_module: Callable[..., Any] | nn.Module | None = None,
    *,
    backend: str | Backend = "inductor",
    mode: str | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile a function or nn.Module; usable as ``kiln.compile(f)``, ``@kiln.compile`` or
    ``@kiln.compile(backend=...)``. Compilation happens on the first call."""
    opts = CompileOptions(
        backend=backend if isinstance(backend, str) else getattr(backend, "__name__", "custom"),
        mode=mode or "default", fullgraph=fullgraph, dynamic=dynamic, options=dict(options or {}),
    )
    if fn_or_module is None:
        return lambda f: compile(f, backend=backend, mode=mode, fullgraph=fullgraph,
                                 dynamic=dynamic, options=options)
    compiled_backend = resolve_backend(backend, opts)
    native_guards.install()  # once per process: guard checks in C (~1 s of g++ the first time on a machine)
    if isinstance(fn_or_module, nn.Module):
        return OptimizedModule(fn_or_module, opts, compiled_backend)
    if not callable(fn_or_module):
        raise TypeError(f"kiln.compile expects a function or nn.Module, got {type(fn_or_module)}")
    return CompiledFunction(fn_or_module, opts, compiled_backend)


class CompiledFunction:
    """A function compiled lazily through kiln.capture; callable like the original."""

    def __init__(self, fn: Callable[..., Any], opts: CompileOptions, backend: Backend) -> None:
        self._fn = fn
        self._opts = opts
        self._backend = backend
        self._optimized = capture.optimize(fn, backend, fullgraph=opts.fullgraph,
                                              dynamic=opts.dynamic)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimized(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    def aot_compile(self, example: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        """Capture the whole function now for ``example`` and compile it ahead of time."""
        return aot.aot_compile(self._fn, example, self._opts, self._backend)


class _CompiledForward:
    """``OptimizedModule.forward``: calls the compiled forward, and offers ``aot_compile``."""

    def __init__(self, owner: OptimizedModule) -> None:
        self._owner = owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        return _call_with_hooks(owner._orig_mod, owner._compiled_forward, args, kwargs)

    def aot_compile(self, example: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        """AOT-compile the module's forward; the result is called as ``compiled(model, *args)``."""
        mod = self._owner._orig_mod
        return aot.aot_compile(type(mod).forward, ((mod, *example[0]), example[1]),
                                    self._owner._opts, self._owner._backend)


class OptimizedModule(nn.Module):
    """Wraps an nn.Module: same parameters, buffers, state_dict (keys under ``_orig_mod.``, as
    torch.compile does), train()/eval() and forward hooks; its forward runs compiled."""

    def __init__(self, mod: nn.Module, opts: CompileOptions, backend: Backend) -> None:
        super().__init__()
        self._orig_mod = mod
        self._opts = opts
        self._backend = backend
        self._compiled_forward = capture.optimize(mod.forward, backend, fullgraph=opts.fullgraph,
                                                     dynamic=opts.dynamic)

    @property
    def forward(self) -> _CompiledForward:  # type: ignore[override]
        return _CompiledForward(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _has_own_hooks(self):  # hooks on the wrapper itself (fully_shard of a compiled block)
            return nn.Module.__call__(self, *args, **kwargs)  # they run, then self.forward
        return _call_with_hooks(self._orig_mod, self._compiled_forward, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def __repr__(self) -> str:
        return f"OptimizedModule(backend={self._opts.backend!r}, mode={self._opts.mode!r})\n" \
               f"  {self._orig_mod!r}"


def _has_own_hooks(m: nn.Module) -> bool:
    g = nn.modules.module
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
                or g._global_backward_pre_hooks)


def _call_with_hooks(mod: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``mod``'s forward pre-hooks and hooks around the compiled forward, as nn.Module does."""
    if mod._backward_hooks or mod._backward_pre_hooks:  # they hang on autograd nodes nn.Module's call
        return capture.call_with_forward(mod, forward, mod, args, kwargs)  # makes around its forward (never run here)
    for hook_id, hook in list(mod._forward_pre_hooks.items()):
        if hook_id in mod._forward_pre_hooks_with_kwargs:
            res = hook(mod, args, kwargs)
            if res is not None:
                args, kwargs = res
        else:
            res = hook(mod, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
    out = forward(*args, **kwargs)
    for hook_id, hook in list(mod._forward_hooks.items()):
        if hook_id in mod._forward_hooks_with_kwargs:
            res = hook(mod, args, kwargs, out)
        else:
            res = hook(mod, args, out)
        if res is not None:
            out = res
    return out


def explain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``kiln.explain(fn)(*args)``: graphs, graph breaks with reasons, guards, op counts."""
    target = fn._orig_mod.forward if isinstance(fn, OptimizedModule) else fn
    opts = getattr(fn, "_opts", None)
    target = getattr(target, "_fn", target)
    return capture.explain(target, dynamic=opts.dynamic if opts is not None else None)


def mark_dynamic(t: torch.Tensor, dim: int | list[int], *, min: int | None = None,  # noqa: A002
                 max: int | None = None) -> None:  # noqa: A002
    """Compile ``t``'s dimension(s) ``dim`` as symbolic sizes from the first call on; ``min``/``max``
    bound the sizes one compiled graph serves (guarded; a loaded artifact refuses others)."""
    capture.mark_dynamic(t, dim, min=min, max=max)


def reset() -> None:
    """Forget every compiled entry (and recompile counts) of every function, and free the memory
    pools of reduce-overhead's CUDA graph trees."""
    capture.reset()
    runtime.graph_cache.forget_live_graphs()
    try:
        trees = importlib.import_module("kiln.inductor.cudagraphs")
    except ImportError:
        return
    trees.reset_default_trees()


def load_compiled_function(file: Any, *, f_globals: dict[str, Any] | None = None,
                           external_data: dict[str, Any] | None = None) -> Any:
    """Load a function saved by ``aot_compile(...).save_compiled_function`` (kiln.runtime's loader)."""
    return runtime.load_compiled_function(file, f_globals=f_globals, external_data=external_data)
