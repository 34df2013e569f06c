"""The user's controls over capture, mirroring ``torch.compiler``'s: ``disable``, ``allow_in_graph``,
``is_compiling``, ``set_stance``, ``mark_static``. Functions marked through ``torch.compiler`` are
honoured too (its markers are attributes on the function; its stance is read where the user set it).

Note: the stance is process-wide state, as torch's is (and as grad mode is): ``set_stance`` is a user
switch, set as a call, a context manager or a decorator, never configuration read deep in a pass.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._python_dispatch
from torch.utils._device import DeviceContext

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile", "eager_then_compile")


class _Stance:
    __slots__ = ("name",)

    def __init__(self) -> None:
        self.name = "default"


_STANCE = _Stance()
_ALLOWED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> function allowed in graph
_ALLOWED_STRONG: dict[int, Any] = {}  # builtins and other callables that take no weak reference


# ---- disable -------------------------------------------------------------------------------------
def disable(fn: Callable | None = None, recursive: bool = True, *, reason: str | None = None) -> Any:
    """``fn`` runs as an opaque Python call: a compiled caller breaks its graph around the call and
    no frame of ``fn`` is captured. ``recursive=False`` skips only ``fn``'s own frame. Note: kiln
    intercepts calls at the boundary of compiled functions (no frame hook), so what ``fn`` calls runs
    in Python either way."""
    def mark(f: Callable) -> Callable:
        if not callable(f):
            raise TypeError(f"kiln.disable expects a callable, got {f!r}")

        @functools.wraps(f)
        def disabled(*args: Any, **kwargs: Any) -> Any:
            return f(*args, **kwargs)
        disabled._kiln_disable = reason or "marked kiln.disable"  # type: ignore[attr-defined]
        disabled._kiln_disable_recursive = recursive  # type: ignore[attr-defined]
        return disabled
    return mark if fn is None else mark(fn)


# torch's own functions marked never-compile (torch.manual_seed, ...) are wrappers with this code
_TORCH_DISABLED_CODE = torch._disable_dynamo(lambda: None).__code__ if hasattr(torch, "_disable_dynamo") else None


def dynamo_patched_original(fn: Any) -> Any | None:
    """The torch.optim function under the never-compile mark (``_torchdynamo_disable``) that torch.compile's
    first use put there for its own tracer (``TorchPatcher``: every optimizer class's ``_init_group``, the
    ``_fused_*`` functions), or None. That mark is a limit of dynamo's, not the user's wish: kiln traces the original,
    as it does in a process where torch.compile never ran (an optimizer step compiled after torch.compile
    was used ran its whole step in Python, 408 us against 57)."""
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    try:
        if getattr(target, "_torchdynamo_disable", False) is not True:
            return None
        msg = getattr(target, "_torchdynamo_disable_msg", None) or ""
        orig = getattr(target, "_torchdynamo_orig_callable", None)
    except Exception:  # objects with unusual __getattr__
        return None
    if not isinstance(orig, types.FunctionType) or not orig.__module__.startswith("torch.optim."):
        return None
    if not (msg == "don't trace into fused optimizer"
            or (msg.startswith("optimizer <class 'torch.optim.") and msg.endswith(" _init_group not supported"))):
        return None
    return types.MethodType(orig, fn.__self__) if isinstance(fn, types.MethodType) else orig


def torch_disabled_wrapper(fn: Any) -> bool:
    """A torch function wrapped by ``torch._disable_dynamo`` (its ``__wrapped__`` is the function)."""
    return getattr(fn, "__code__", None) is _TORCH_DISABLED_CODE and _TORCH_DISABLED_CODE is not None


def disabled_reason(fn: Any) -> str | None:
    """Why ``fn`` must not be captured (``kiln.disable`` or ``torch.compiler.disable``), or None."""
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if torch_disabled_wrapper(target):
        return f"a torch function marked never to be compiled ({getattr(target, '__qualname__', target)})"
    try:
        reason = getattr(target, "_kiln_disable", None)
        if reason is None and getattr(target, "_torchdynamo_disable", False) is True:
            msg = getattr(target, "_torchdynamo_disable_msg", None)
            reason = "marked torch.compiler.disable" + (f" ({msg})" if msg else "")
    except Exception:  # objects with unusual __getattr__
        return None
    return reason if isinstance(reason, str) else None


# ---- allow_in_graph ----------------------------------------------------------------------------------
def allow_in_graph(fn: Any) -> Any:
    """``fn`` is recorded as one node of the graph (run on fake tensors at capture, not inlined)."""
    if isinstance(fn, (list, tuple)):
        return [allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise TypeError(f"kiln.allow_in_graph expects a callable, got {fn!r}")
    try:
        _ALLOWED[id(fn)] = fn
    except TypeError:
        _ALLOWED_STRONG[id(fn)] = fn
    return fn


def allowed_in_graph(fn: Any) -> bool:
    return _ALLOWED.get(id(fn)) is fn or _ALLOWED_STRONG.get(id(fn)) is fn


# ---- is_compiling ------------------------------------------------------------------------------------
def is_compiling() -> bool:
    """False when running in Python; True inside code kiln traces (the tracer answers the call)."""
    return False


# ---- set_stance ----------------------------------------------------------------------------------------
class set_stance:  # noqa: N801 (a function, context manager and decorator, as torch's)
    """``kiln.set_stance(name)``: "default"; "force_eager" (run every compiled function in Python);
    "eager_on_recompile" (run in Python instead of recompiling; cached entries still run);
    "fail_on_recompile" (raise instead of recompiling); "eager_then_compile" (the first call runs in
    Python). A call sets it; ``with`` and ``@`` restore the previous one afterwards."""

    def __init__(self, stance: str = "default") -> None:
        if stance not in STANCES:
            raise ValueError(f"kiln.set_stance: unknown stance {stance!r}; expected one of {STANCES}")
        self.stance = stance
        self.prev = _STANCE.name
        _STANCE.name = stance

    def __enter__(self) -> set_stance:
        return self

    def __exit__(self, *exc: Any) -> None:
        _STANCE.name = self.prev

    def __call__(self, fn: Callable) -> Callable:
        _STANCE.name = self.prev  # as a decorator it applies during calls only
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args: Any, **kwargs: Any) -> Any:
            prev, _STANCE.name = _STANCE.name, stance
            try:
                return fn(*args, **kwargs)
            finally:
                _STANCE.name = prev
        return with_stance


def current_stance() -> str:
    """kiln's stance (``kiln.set_stance``). Note: ``torch.compiler.set_stance`` and
    ``torch.compiler.allow_in_graph`` keep their state inside torch's own compiler, which kiln does not
    read (DESIGN.md); use the ``kiln.*`` controls."""
    return _STANCE.name


# ---- mark_static -----------------------------------------------------------------------------------------
def mark_static(t: Any, index: int | list[int] | tuple[int, ...] | None = None) -> None:
    """Keep dims of ``t`` (all when ``index`` is None) static under automatic dynamic shapes and
    ``dynamic=True``. An nn.Module class is accepted (kiln already treats module attributes as
    guarded constants)."""
    if isinstance(t, type) and issubclass(t, torch.nn.Module):
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kiln.mark_static expects a tensor or an nn.Module class, got {type(t).__name__}")
    dims = range(t.dim()) if index is None else ([index] if isinstance(index, int) else list(index))
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"mark_static: dim {d} is out of range for a tensor of {t.dim()} dims")
    static = set(getattr(t, "_kiln_static_dims", ()))
    static.update(d % max(t.dim(), 1) for d in dims)
    t._kiln_static_dims = static  # type: ignore[attr-defined]


def static_dims(t: Any) -> frozenset[int]:
    return frozenset(getattr(t, "_kiln_static_dims", ()))


# ---- the caller's torch modes ---------------------------------------------------------------------
_fn_modes = torch._C._len_torch_function_stack
_fn_mode_at = torch._C._get_function_stack_at
_dispatch_modes = torch._C._len_torch_dispatch_stack


def active_mode_reason() -> str | None:
    """Why a call must run eagerly because of a torch mode the caller entered, or None.

    Note: a compiled graph runs as generated code, below ``__torch_function__`` and
    ``__torch_dispatch__``: a ``TorchFunctionMode`` the user entered (one that rewrites ops) or a
    ``TorchDispatchMode`` (FakeTensorMode, a dtype-changing mode) would silently not apply to it. Such
    calls run eagerly, as torch.compile does under a dispatch mode. The default-device context
    (``with torch.device``, itself a function mode) is guarded instead (GLOBAL_STATE)."""
    if not _fn_modes() and not _dispatch_modes():
        return None
    for i in range(_fn_modes()):
        mode = _fn_mode_at(i)
        if not isinstance(mode, DeviceContext):
            return f"a torch function mode ({type(mode).__name__}) is active; compiled graphs run below it"
    if _dispatch_modes():
        modes = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
        names = ", ".join(type(m).__name__ for m in modes) or "a C++ mode"
        return f"a torch dispatch mode ({names}) is active; compiled graphs run below it"
    return None
