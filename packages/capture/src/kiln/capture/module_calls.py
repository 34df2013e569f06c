"""Module calls whose Python side runs on every call, with only the module's forward compiled.

Note: some module calls do per-call work in Python that a graph cannot hold: DistributedDataParallel's
forward prepares its reducer for the backward (``prepare_for_forward``, ``prepare_for_backward``,
``no_sync``'s flag, bucket rebuilding), and FSDP2's forward hooks all-gather and reshard parameters.
Traced once and cached, that work would happen on the first call only (the all-reduce silently
skipped from the second step on). So such a call is never traced: the wrapper (DDP's forward, the
module's hooks) runs in Python on every call, and the compiled part is the wrapped module's
``forward``, captured as its own frame — what torch.compile does with its frame hook. kiln has no
frame hook, so the forward is routed to the compiled frame for the duration of the call through an
instance attribute (``module.forward``, which ``nn.Module.__call__`` looks up), restored afterwards.
"""

from __future__ import annotations

import itertools
import operator
import types
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from kiln.graph import enabled, log

try:
    from torch.nn.parallel import DistributedDataParallel as _DDP
except ImportError:  # a torch built without distributed
    _DDP = None  # type: ignore[assignment,misc]

# Hooks defined in these modules do distributed work (FSDP2's all-gather/reshard): never traced.
_PYTHON_HOOK_MODULES = ("torch.distributed",)


def python_wrapper_child(module: Any) -> nn.Module | None:
    """The module whose forward a Python-only wrapper calls (DDP's ``.module``), else None."""
    if _DDP is not None and isinstance(module, _DDP):
        child = module._modules.get("module")
        return child if isinstance(child, nn.Module) else None
    return None


def _hook_functions(m: nn.Module) -> list[Any]:
    tables = (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks,
              getattr(m, "_backward_pre_hooks", {}))
    return [h for t in tables for h in t.values()]


def has_python_hooks(m: nn.Module) -> bool:
    """Whether a hook of ``m`` comes from torch.distributed (FSDP2's unshard/reshard hooks)."""
    for h in _hook_functions(m):
        fn = getattr(h, "__func__", h)
        if (getattr(fn, "__module__", None) or "").startswith(_PYTHON_HOOK_MODULES):
            return True
    return False


def runs_in_python(module: Any) -> str | None:
    """Why a call of ``module`` must run in Python (wrapper or hooks), or None when it is traced."""
    if not isinstance(module, nn.Module):
        return None
    if python_wrapper_child(module) is not None:
        return f"{type(module).__name__}.forward runs in Python on every call (per-call reducer work)"
    if has_python_hooks(module):
        return f"{type(module).__name__}'s torch.distributed hooks run in Python on every call"
    return None


def backward_hooks_reason(module: nn.Module) -> str | None:
    """Why a call of ``module`` runs in Python for its backward hooks (its own, or global ones), or
    None: they hang on autograd nodes of the call's tensors, which a graph does not make (traced, they
    never fired)."""
    g = nn.modules.module
    if module._backward_hooks or getattr(module, "_backward_pre_hooks", None) or g._global_backward_hooks or \
            getattr(g, "_global_backward_pre_hooks", None):
        return f"call to {type(module).__name__} with backward hooks"
    return None


def plain_forward(module: nn.Module) -> Callable:
    """``module.forward`` as the class (or instance) defines it, bound to ``module``."""
    own = module.__dict__.get("forward")
    if own is not None and not isinstance(own, RoutedForward):
        return own
    return types.MethodType(type(module).forward, module)


class RoutedForward:
    """Installed as ``module.forward`` while a routed call runs: calls the compiled frame."""

    __slots__ = ("compiled",)

    def __init__(self, compiled: Callable) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)


class PythonModuleCall:
    """``call(*args)`` runs ``outer(*args)`` in Python (its wrapper forward and hooks every time)
    while ``target.forward`` is the compiled frame ``compiled``."""

    def __init__(self, outer: nn.Module, target: nn.Module, compiled: Callable, reason: str,
                 call_forward: bool = False) -> None:
        self.outer = outer
        self.target = target
        self.routed = RoutedForward(compiled)
        self.call_forward = call_forward  # call outer.forward (no hooks of outer) instead of outer()
        if enabled("distributed"):
            log("distributed").info("%s; %s.forward is compiled as its own frame", reason,
                                    type(target).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outer = self.outer
        call = (lambda *a, **k: type(outer).forward(outer, *a, **k)) if self.call_forward else outer
        return call_with_forward(self.target, self.routed, call, args, kwargs)


def call_with_forward(target: nn.Module, forward: Callable, call: Callable, args: tuple, kwargs: dict) -> Any:
    """``call(*args, **kwargs)`` while ``forward`` is ``target``'s forward (nn.Module's own call of a
    module, its hooks included, running a compiled forward)."""
    d = target.__dict__
    had = "forward" in d
    previous = d.get("forward")
    d["forward"] = forward
    try:
        return call(*args, **kwargs)
    finally:
        if had:
            d["forward"] = previous
        else:
            d.pop("forward", None)


__all__ = ["PythonModuleCall", "backward_hooks_reason", "call_with_forward", "has_python_hooks", "plain_forward",
           "python_wrapper_child", "runs_in_python"]


# ---- what decided how a module call was traced ----------------------------------------------------
_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                       "_global_backward_pre_hooks")

# (the module's __dict__, whether it had hooks, its instance ``forward`` or None) per traced call
CallPath = tuple[dict, bool, Any]


def has_own_hooks(m: nn.Module) -> bool:
    d = m.__dict__
    return any(bool(d.get(t)) for t in _HOOK_TABLES)


def call_path(m: nn.Module) -> CallPath:
    return m.__dict__, has_own_hooks(m), m.__dict__.get("forward")


def global_hook_keys() -> tuple:
    g = nn.modules.module
    return tuple(tuple(getattr(g, t).keys()) for t in _GLOBAL_HOOK_TABLES)


def call_path_check(paths: tuple[CallPath, ...], global_keys: tuple) -> Callable[[], bool]:
    """Whether every module call of an entry would be traced the same way now: the same hooks
    present or absent (hooks present were traced through ``_call_impl``, which guards them), the same
    instance ``forward``, the same global module hooks.

    Note: torch registers every hook through ``RemovableHandle``, whose id counter is global; while
    it has not moved since the last check no hook was added anywhere, so the hook tables are read
    only after a registration. Which ``forward`` each module has is one C-level pass over their
    dicts. Five guards per module instead (hook tables and forward) made a 240-module model's guard
    check about twice as slow. The modules are the very objects ID_MATCH guards of the entry pin;
    modules guarded by type only (a new object each call) are guarded through their sources."""
    plain = [d for d, _, forward in paths if forward is None]
    own = [(d, forward) for d, _, forward in paths if forward is not None]
    seen = [RemovableHandle.next_id]

    def hooks_same() -> bool:
        if global_hook_keys() != global_keys:
            return False
        return all(any(bool(d.get(t)) for t in _HOOK_TABLES) is hooks for d, hooks, _ in paths)

    def check() -> bool:
        if any(map(operator.contains, plain, itertools.repeat("forward", len(plain)))):
            return False
        if own and any(d.get("forward") is not forward for d, forward in own):
            return False
        if RemovableHandle.next_id != seen[0]:
            if not hooks_same():
                return False
            seen[0] = RemovableHandle.next_id
        return True
    return check
