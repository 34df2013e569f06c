"""``optimize(fn, backend)``: the wrapper that checks guards, runs compiled entries, captures on a
miss, and continues in Python after a graph break through generated resume functions."""

from __future__ import annotations

import functools
import inspect
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from kiln.graph import GuardSet, enabled, gc_paused, log

from .cache import CacheEntry, CodeCache
from .capture import CONTENTS, BreakPlan, Capture, run_capture
from .ddp_buckets import bucket_split_backend
from .errors import GraphBreak, SkipFrame, Unsupported
from .knobs import CaptureOptions
from .module_calls import PythonModuleCall, plain_forward, python_wrapper_child, runs_in_python
from .pipeline import compile_capture
from .python_step import CAN_RUN, NEXT, execute_in_python
from .resume import make_resume_function

_ALL_CONTEXTS: weakref.WeakSet = weakref.WeakSet()


class CompileContext:
    """One optimize() call: its backend, options, caches (per code object) and wrapped callees."""

    def __init__(self, backend: Callable, options: CaptureOptions) -> None:
        self.backend = backend
        self.options = options
        self.caches: dict[types.CodeType, CodeCache] = {}
        self.wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.wrapped_methods: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.resumes: dict[tuple, Callable] = {}
        self.python_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.subclass_logged: set[types.CodeType] = set()
        self.on_capture: list[Callable[[Capture, CodeCache], None]] = []
        _ALL_CONTEXTS.add(self)

    def cache_for(self, code: types.CodeType) -> CodeCache:
        c = self.caches.get(code)
        if c is None:
            c = self.caches[code] = CodeCache(code)
        return c

    def reset(self) -> None:
        self.caches.clear()
        self.wrapped = weakref.WeakKeyDictionary()
        self.wrapped_methods = weakref.WeakKeyDictionary()
        self.python_calls = weakref.WeakKeyDictionary()
        self.resumes.clear()

    def python_module_call(self, module: nn.Module, reason: str, call_forward: bool = False) -> PythonModuleCall:
        """``module`` called in Python (DDP's forward, FSDP2's hooks) with the forward it wraps
        compiled as its own frame (module_calls.py)."""
        key = (call_forward,)
        per_module = self.python_calls.setdefault(module, {})
        call = per_module.get(key)
        if call is None:
            child = python_wrapper_child(module)
            ctx = self
            cap = getattr(module, "bucket_bytes_cap", None)
            if child is not None and isinstance(cap, int):
                # DDP: the wrapped forward is compiled in pieces of one gradient bucket each (ddp_buckets.py)
                ctx = CompileContext(bucket_split_backend(self.backend, cap, type(child).__name__), self.options)
            target = child or module
            call = per_module[key] = PythonModuleCall(module, target, Optimized(plain_forward(target), ctx),
                                                      reason, call_forward)
        return call

    def wrap_callee(self, fn: Any) -> Any:
        """A callable met at a graph break, routed through this context so it is captured too."""
        if fn is _CHECKPOINT:  # runs in Python; the function it checkpoints is compiled as its own frame
            return functools.partial(_checkpoint_compiled, self)
        if isinstance(fn, nn.Module):
            reason = runs_in_python(fn)
            if reason is not None:
                return self.python_module_call(fn, reason)
            if fn._forward_hooks or fn._forward_pre_hooks or not isinstance(type(fn).forward, types.FunctionType) \
                    or type(fn).__call__ is not nn.Module.__call__:
                return fn
        elif isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            pass
        elif not isinstance(fn, types.FunctionType):
            return fn
        mod = getattr(getattr(fn, "__func__", fn), "__module__", "") or ""
        if mod.startswith(("torch.", "kiln.")) and not isinstance(fn, nn.Module) or mod == "torch":
            return fn
        is_method = isinstance(fn, types.MethodType)
        key = fn.__self__ if is_method else fn
        table = self.wrapped_methods if is_method else self.wrapped
        try:
            cached = table.get(key)
        except TypeError:
            return fn
        if cached is not None and is_method:
            cached = cached.get(fn.__func__)
        if cached is not None:
            return cached
        if isinstance(fn, nn.Module):
            wrapped = Optimized(fn.forward, self)
            table[key] = wrapped
        elif is_method:
            wrapped = Optimized(fn, self)
            try:
                table.setdefault(key, {})[fn.__func__] = wrapped
            except TypeError:
                pass
        else:
            wrapped = Optimized(fn, self)
            table[key] = wrapped
        return wrapped


class Optimized:
    """The callable ``optimize`` returns (without functools.wraps applied; see ``optimize``)."""

    def __init__(self, fn: Any, ctx: CompileContext) -> None:
        self.fn = fn
        self.ctx = ctx
        func = fn
        self.self_obj = None
        if isinstance(fn, types.MethodType):
            func, self.self_obj = fn.__func__, fn.__self__
        elif not isinstance(fn, types.FunctionType):
            call = getattr(type(fn), "__call__", None)  # noqa: B004 (the type's __call__)
            if isinstance(fn, nn.Module):
                func, self.self_obj = type(fn).forward, fn
            elif isinstance(call, types.FunctionType):
                func, self.self_obj = call, fn
            else:
                func = None
        self.func = func
        self.code: types.CodeType | None = getattr(func, "__code__", None)
        self.f_globals: dict = getattr(func, "__globals__", {})
        self.closure = getattr(func, "__closure__", None)
        self.sig = inspect.signature(func, follow_wrapped=False) if func is not None else None
        self.simple = self.code is not None and not (self.code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)) \
            and not self.code.co_kwonlyargcount and not func.__defaults__
        self.names = self.code.co_varnames[:self.code.co_argcount] if self.code else ()
        if self.code is not None and self.code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE |
                                                           inspect.CO_ASYNC_GENERATOR):
            cache = ctx.cache_for(self.code)
            cache.eager_reason = "generators and coroutines run eagerly"
        self.cache = ctx.cache_for(self.code) if self.code is not None else None

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if self.self_obj is not None:
            args = (self.self_obj, *args)
        if self.simple and not kwargs and len(args) == len(self.names):
            L = dict(zip(self.names, args))
            if self.closure:
                L["__closure__"] = self.closure
            return L
        else:
            ba = self.sig.bind(*args, **kwargs)  # type: ignore[union-attr]
            ba.apply_defaults()
            L = dict(ba.arguments)
        if self.closure:
            L["__closure__"] = self.closure
        return L

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache = self.cache
        if cache is None or cache.eager_reason is not None:
            return self.fn(*args, **kwargs)
        L = self.bind(args, kwargs)
        G = self.f_globals
        for entry in cache.entries:
            try:
                ok = entry.check(L, G)
            except Exception:
                ok = False
            if ok:
                entry.hits += 1
                return entry.run(L, G)
        return self.miss(L, G, args, kwargs)

    # ---- a cache miss ------------------------------------------------------------------
    def miss(self, L: dict, G: dict, args: tuple, kwargs: dict) -> Any:
        cache = self.cache
        assert cache is not None and self.code is not None
        options = self.ctx.options
        if cache.entries:
            if len(cache.entries) >= options.recompile_limit:
                if not cache.limit_warned:
                    cache.limit_warned = True
                    warnings.warn(f"kiln.capture: {self.code.co_name} ({self.code.co_filename}:"
                                  f"{self.code.co_firstlineno}) hit the recompile limit "
                                  f"({options.recompile_limit}); it runs eagerly from now on. Last "
                                  f"reason: {self._miss_reason(L, G)}", stacklevel=3)
                return self.fn(*args, **kwargs)
            cache.recompiles += 1
            if enabled("recompiles"):
                log("recompiles").info("recompiling %s (%s:%s): %s", self.code.co_name, self.code.co_filename,
                                       self.code.co_firstlineno, self._miss_reason(L, G))
        subclass = _subclass_input(L, self.self_obj)
        if subclass is not None:  # e.g. DTensor parameters/activations of tensor parallelism
            return self._subclass_eager(subclass, args, kwargs)
        fallback: tuple[str, bool] | None = None
        # Note: a capture met under a caller's saved-tensor hooks (torch.utils.checkpoint's recording)
        # must not feed them the tensors its own tracing saves: identity hooks sit on top meanwhile.
        with gc_paused(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            entry, fallback = self._compile(L, G, cache, options)
        if fallback is not None:  # outside the except blocks: eager errors carry no capture context
            return self._eager(fallback[0], args, kwargs, permanent=fallback[1])
        assert entry is not None
        cache.entries.append(entry)
        return entry.run(L, G)

    def _compile(self, L: dict, G: dict, cache: CodeCache,
                 options: CaptureOptions) -> tuple[CacheEntry | None, tuple[str, bool] | None]:
        """Capture the frame and compile it: (the new cache entry, None) or (None, (reason, permanent))
        when it runs eagerly instead."""
        assert self.code is not None
        fallback: tuple[str, bool] | None = None
        try:
            cap = run_capture(self.code, G, self.closure, L, options, cache.dynamic_policy(options),
                              cache.may_be_dynamic(L, options))
        except Unsupported:
            raise
        except SkipFrame as e:
            fallback = (f"{e}", True)
        except GraphBreak as e:
            if options.fullgraph:
                raise Unsupported(f"{e.reason} (hint: {e.hint})") from e
            fallback = (e.reason, False)
        except Exception as e:  # a user error during tracing: eager raises it with the real traceback
            if options.fullgraph and not isinstance(e, (TypeError, ValueError, AssertionError, RuntimeError,
                                                        KeyError, IndexError, AttributeError, NameError)):
                raise
            fallback = (f"{type(e).__name__} while tracing: {e}", False)
        if fallback is None and cap.break_plan is not None and cap.break_plan.inst.opname not in CAN_RUN:
            fallback = (f"graph break at {cap.break_plan.inst.opname}, which cannot run in Python between "
                        f"graphs: {cap.break_plan.reason}", True)
        if fallback is not None:
            return None, fallback
        entry = self._make_entry(cap)
        for hook in self.ctx.on_capture:
            hook(cap, cache)
        return entry, None

    def _subclass_eager(self, what: str, args: tuple, kwargs: dict) -> Any:
        """A frame whose inputs are tensor subclasses runs eagerly (this call; logged once per frame):
        kiln traces plain tensors, so the graph breaks cleanly at the subclass boundary."""
        assert self.code is not None
        if self.code not in self.ctx.subclass_logged:
            self.ctx.subclass_logged.add(self.code)
            log("graph_breaks").info("running %s (%s:%s) eagerly while its inputs are tensor subclasses: %s",
                                     self.code.co_name, self.code.co_filename, self.code.co_firstlineno, what)
        return self.fn(*args, **kwargs)

    def _miss_reason(self, L: dict, G: dict) -> str:
        assert self.cache is not None
        for entry in self.cache.entries:
            failure = entry.guards.first_failure(L, G)
            if failure is not None:
                g, actual = failure
                return f"guard failed: {g.kind} {g.source or '<global>'}: expected {g.expected!r}, got {actual}"
        return "no entry matched"

    def _eager(self, reason: str, args: tuple, kwargs: dict, permanent: bool) -> Any:
        assert self.code is not None and self.cache is not None
        log("graph_breaks").info("running %s (%s:%s) eagerly: %s", self.code.co_name, self.code.co_filename,
                                 self.code.co_firstlineno, reason)
        if permanent:
            self.cache.eager_reason = reason
        return self.fn(*args, **kwargs)

    def _make_entry(self, cap: Capture) -> CacheEntry:
        compiled = compile_capture(cap, self.ctx.backend, self.code)
        identity = {g.source for g in cap.captured.guards if g.kind == "ID_MATCH"}
        extract = _extractor(cap.input_sources, cap.example_inputs, identity)
        check = cap.captured.guards.compile()
        effects = cap.side_effects
        if cap.break_plan is None:
            plan = cap.result_plan
            assert plan is not None
            if effects:
                def run(L: dict, G: dict) -> Any:
                    outs = compiled(*extract(L, G)) if compiled is not None else ()
                    pending = _effect_values(effects, outs, L, G)
                    result = plan(outs, L, G)
                    _apply(pending)
                    return result
            elif compiled is None:
                def run(L: dict, G: dict) -> Any:
                    return plan((), L, G)
            else:
                def run(L: dict, G: dict) -> Any:
                    return plan(compiled(*extract(L, G)), L, G)
        else:
            run = self._break_runner(cap.break_plan, compiled, extract, effects)
        return CacheEntry(cap.captured.guards, check, run, cap, compiled)

    def _break_runner(self, bp: BreakPlan, compiled: Any, extract: Callable, effects: list) -> Callable:
        assert self.code is not None
        code, ctx, f_globals = self.code, self.ctx, self.f_globals
        log("graph_breaks").info("graph break in %s: %s\n  at %s", code.co_name, bp.reason,
                                 "\n  from ".join(bp.user_stack))
        names = tuple(bp.local_names)

        def run(L: dict, G: dict) -> Any:
            outs = compiled(*extract(L, G)) if compiled is not None else ()
            pending = _effect_values(effects, outs, L, G) if effects else ()
            stack = [NEXT if p is None else p(outs, L, G) for p in bp.stack_plans]
            values = [p(outs, L, G) for p in bp.local_plans]
            if pending:
                _apply(pending)
            stack, offset = execute_in_python(code, bp.inst, stack, bp.kw_names, ctx.wrap_callee)
            mask = tuple(v is NEXT for v in stack)
            key = (code, offset, mask, names)
            resume = ctx.resumes.get(key)
            if resume is None:
                fn = make_resume_function(code, f_globals, L.get("__closure__"), offset, mask, names)
                resume = ctx.resumes[key] = Optimized(fn, ctx)
            return resume(*[v for v in stack if v is not NEXT], *values)
        return run


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter, nn.parameter.Buffer, FakeTensor)  # fakes are traced as is


def _subclass_input(L: dict, self_obj: Any) -> str | None:
    """The first frame input (argument, or parameter of the module whose forward this is) of a
    tensor subclass."""
    for name, v in L.items():
        if isinstance(v, torch.Tensor) and type(v) not in _PLAIN_TENSORS:
            return f"{name}: {type(v).__name__}"
    if isinstance(self_obj, nn.Module):
        for pname, p in self_obj._parameters.items():
            if p is not None and type(p) not in _PLAIN_TENSORS:
                return f"self.{pname}: {type(p).__name__}"
    return None


_CHECKPOINT = torch.utils.checkpoint.checkpoint


def _same(t: Any) -> Any:
    return t


def _checkpoint_compiled(ctx: CompileContext, function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` met at a graph break: it runs in Python (its saved-tensor
    hooks and recomputation), calling ``function`` compiled; the recomputation hits the same entry."""
    return _CHECKPOINT(ctx.wrap_callee(function), *args, **kwargs)


_DELETE = object()  # an attribute deletion (it has no value plan)


def _effect_values(effects: list, outs: Any, L: dict, G: dict) -> list:
    """Everything the side effects will write, computed before any is applied (and before the
    frame's own values are rebuilt) so no plan reads state a replay already changed."""
    return [(obj_plan(outs, L, G), name, _DELETE if value_plan is None else value_plan(outs, L, G))
            for obj_plan, name, value_plan in effects]


def _apply(pending: list) -> None:
    for obj, name, value in pending:
        if name == CONTENTS:  # an input list/dict changed in place by the traced code
            if isinstance(obj, list):
                obj[:] = value
            else:
                obj.clear()
                obj.update(value)
        elif value is _DELETE:
            if hasattr(obj, name):
                delattr(obj, name)
        else:
            setattr(obj, name, value)


def _extractor(sources: list[str], values: list[Any] | None = None,
               identity: set[str] | None = None) -> Callable[[dict, dict], list]:
    """``lambda L, G: [inputs...]``; sources pinned by an ID_MATCH guard are the very objects
    seen at capture (the entry keeps them alive), so they are not looked up again."""
    ns: dict[str, Any] = {}
    parts = []
    for i, src in enumerate(sources):
        if identity and values is not None and src in identity:
            ns[f"_v{i}"] = values[i]
            parts.append(f"_v{i}")
        else:
            parts.append(src)
    return eval(f"lambda L, G: [{', '.join(parts)}]", ns)  # noqa: S307 (sources we generated)


def optimize(fn: Callable, backend: Callable, *, fullgraph: bool = False, dynamic: bool | None = None,
             recompile_limit: int = 8) -> Callable:
    """Capture ``fn`` into torch-dialect graphs compiled by ``backend``, guarded and cached."""
    ctx = CompileContext(backend, CaptureOptions(fullgraph, dynamic, recompile_limit))
    opt = Optimized(fn, ctx)
    if opt.code is None:
        raise TypeError(f"kiln.capture.optimize needs a Python function, method or module; got {fn!r}")
    python_call = _python_wrapper_call(fn, ctx)
    if python_call is not None:
        return _mark(functools.wraps(opt.func)(lambda *a, **k: python_call(*a, **k)), opt, ctx)

    cache, G, bind = opt.cache, opt.f_globals, opt.bind

    @functools.wraps(fn if not isinstance(fn, nn.Module) else type(fn).forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # the hit path, kept flat: bind, check each entry's guards, run the first that passes
        if cache is not None and cache.eager_reason is None:
            L = bind(args, kwargs)
            for entry in cache.entries:
                try:
                    ok = entry.check(L, G)
                except Exception:
                    ok = False
                if ok:
                    entry.hits += 1
                    return entry.run(L, G)
            return opt.miss(L, G, args, kwargs)
        return opt(*args, **kwargs)
    return _mark(wrapper, opt, ctx)


def _mark(wrapper: Callable, opt: Optimized, ctx: CompileContext) -> Callable:
    wrapper._kiln_optimized = opt  # type: ignore[attr-defined]
    wrapper._kiln_context = ctx  # type: ignore[attr-defined]
    return wrapper


def _python_wrapper_call(fn: Any, ctx: CompileContext) -> PythonModuleCall | None:
    """``optimize(ddp)`` / ``optimize(ddp.forward)``: DDP's forward runs in Python on every call and
    its module's forward is the compiled frame (module_calls.py)."""
    owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
    if not isinstance(owner, nn.Module) or python_wrapper_child(owner) is None:
        return None
    if owner is not fn and getattr(fn, "__func__", None) is not type(owner).forward:
        return None
    reason = runs_in_python(owner)
    assert reason is not None
    return ctx.python_module_call(owner, reason, call_forward=owner is not fn)


def reset() -> None:
    """Forget every cache entry of every optimize() wrapper (the wrappers stay usable)."""
    for ctx in list(_ALL_CONTEXTS):
        for cache in ctx.caches.values():
            cache.entries.clear()
            cache.recompiles = 0
            cache.limit_warned = False
            cache.seen_shapes.clear()
            cache.dynamic.clear()
            cache.seen_ints.clear()
            cache.dynamic_ints.clear()
            if cache.eager_reason != "generators and coroutines run eagerly":
                cache.eager_reason = None
        ctx.reset()


def cache_entries(fn: Callable) -> list[CacheEntry]:
    """The cache entries of an optimize() wrapper for its own code object (for tests and tools)."""
    opt: Optimized = fn._kiln_optimized  # type: ignore[attr-defined]
    return list(opt.cache.entries) if opt.cache is not None else []


def recompile_count(fn: Callable) -> int:
    opt: Optimized = fn._kiln_optimized  # type: ignore[attr-defined]
    return opt.cache.recompiles if opt.cache is not None else 0


def mark_dynamic(t: torch.Tensor, dim: int | list[int]) -> None:
    """Make ``dim`` of ``t`` symbolic from the first capture on."""
    dims = set(getattr(t, "_kiln_dynamic_dims", ()))
    dims.update([dim] if isinstance(dim, int) else dim)
    t._kiln_dynamic_dims = dims  # type: ignore[attr-defined]


__all__ = ["GuardSet", "optimize", "reset", "cache_entries", "mark_dynamic"]
