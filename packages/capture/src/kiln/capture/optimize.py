"""``optimize(fn, backend)``: the wrapper that checks guards, runs compiled entries, captures on a
miss, and continues in Python after a graph break through generated resume functions."""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import sysconfig
import time
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from kiln.graph import (
    FrameRunEagerly,
    GraphBreakEvent,
    GraphCaptured,
    Guard,
    GuardSet,
    Recompile,
    StageTime,
    emit,
    enabled,
    gc_paused,
    log,
)

from .aliasing import AliasMismatch
from .cache import CacheEntry, CodeCache
from .capture import CONTENTS, BreakPlan, Capture, run_capture
from .controls import active_mode_reason, current_stance, disabled_reason
from .ddp_buckets import bucket_split_backend
from .deferred import CALL, EXIT_CALL
from .errors import GraphBreak, SkipFrame, Unsupported
from .extract import extractor
from .knobs import CaptureOptions
from .module_calls import (
    PythonModuleCall,
    backward_hooks_reason,
    call_path_check,
    plain_forward,
    python_wrapper_child,
    runs_in_python,
)
from .pending import wait_pending
from .pinned_layouts import EPOCH, PinnedLayouts, pinned_layouts
from .pipeline import compile_capture, frame_name, needs_backend
from .python_step import CAN_RUN, NEXT, execute_in_python
from .reasons import ALIASING, RELAID_OUT, failure_key, failure_text
from .resume import make_resume_function
from .sources import local_source

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
        self.pending_logged: set[types.CodeType] = set()  # frames that waited for a collective at the call
        self.dtensor_programs: dict[tuple, Any] = {}  # (code, dtensor_frames.frame_key) -> program or reason
        self.on_capture: list[Callable[[Capture, CodeCache], None]] = []
        self.observed = True  # emits compile events (kiln.graph.events); explain's dry runs do not
        self.on_eager: list[Callable[[str, str], None]] = []  # (function at file:line, reason)
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
        self.dtensor_programs.clear()

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
        if disabled_reason(type(fn).forward if isinstance(fn, nn.Module) else fn) is not None:
            return fn
        if isinstance(fn, nn.Module):
            reason = runs_in_python(fn) or backward_hooks_reason(fn)
            if reason is not None:  # called in Python (its hooks), its forward compiled as its own frame
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
        self._read_signature()
        self.simple = self.code is not None and not (self.code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)) \
            and not self.code.co_kwonlyargcount and not func.__defaults__
        self.names = self.code.co_varnames[:self.code.co_argcount] if self.code else ()
        # ``def wrapper(self, *args, **kwargs)`` (decorators, HF's forwards): bound without inspect
        self.star_names = _star_names(self.code, func) if self.code is not None else None
        if self.code is not None and self.code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE |
                                                           inspect.CO_ASYNC_GENERATOR):
            cache = ctx.cache_for(self.code)
            cache.eager_reason = "generators and coroutines run eagerly"
        self.cache = ctx.cache_for(self.code) if self.code is not None else None
        self.disabled = disabled_reason(fn if not isinstance(fn, nn.Module) else type(fn).forward)

    def _read_signature(self) -> None:
        func = self.func
        self.sig = inspect.signature(func, follow_wrapped=False) if func is not None else None
        self.defaults = (getattr(func, "__defaults__", None), getattr(func, "__kwdefaults__", None))

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if self.self_obj is not None:
            args = (self.self_obj, *args)
        if self.simple and not kwargs and len(args) == len(self.names):
            L = dict(zip(self.names, args))
            if self.closure:
                L["__closure__"] = self.closure
            return L
        star = self.star_names
        if star is not None and len(args) >= len(self.names) and (not self.names or kwargs.keys().isdisjoint(self.names)):
            n = len(self.names)
            L = dict(zip(self.names, args))
            L[star[0]] = args[n:]
            L[star[1]] = dict(kwargs)
            if self.closure:
                L["__closure__"] = self.closure
            return L
        else:
            if self.func.__defaults__ is not self.defaults[0] or self.func.__kwdefaults__ is not self.defaults[1]:
                self._read_signature()  # defaults replaced since (``f.__defaults__ = ...``)
            ba = self.sig.bind(*args, **kwargs)  # type: ignore[union-attr]
            ba.apply_defaults()
            L = dict(ba.arguments)
        if self.closure:
            L["__closure__"] = self.closure
        return L

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache = self.cache
        if self.disabled is not None or current_stance() == "force_eager":
            return self._eager(self.disabled or "set_stance('force_eager')", args, kwargs, permanent=False)
        mode = active_mode_reason()
        if mode is not None:
            return self._eager(mode, args, kwargs, permanent=False)
        if cache is None or cache.eager_reason is not None:
            if cache is not None:
                if self.ctx.observed and not cache.eager_reported:  # kiln.stats counts the frame once
                    cache.eager_reported = True
                    emit(FrameRunEagerly(frame_name(cache.code), cache.eager_reason or ""))
                for hook in self.ctx.on_eager:
                    hook(frame_name(cache.code), cache.eager_reason or "")
            return self.fn(*args, **kwargs)
        L = self.bind(args, kwargs)
        G = self.f_globals
        for entry in reversed(cache.entries):
            try:
                ok = entry.check(L, G)
            except Exception:
                ok = False
            if ok:
                try:
                    out = entry.run(L, G)
                except AliasMismatch:  # raised before the graph ran: another entry, or a new one
                    continue
                entry.hits += 1
                return out
        return self.miss(L, G, args, kwargs)

    # ---- a cache miss ------------------------------------------------------------------
    def miss(self, L: dict, G: dict, args: tuple, kwargs: dict) -> Any:
        cache = self.cache
        assert cache is not None and self.code is not None
        waited = wait_pending(args, kwargs)
        if waited is not None:  # a pending collective result: the frame takes its value (pending.py)
            args, kwargs, count = waited
            if self.code not in self.ctx.pending_logged:
                self.ctx.pending_logged.add(self.code)
                log("distributed").info("%s waits for %d pending collective result(s) (AsyncCollectiveTensor) "
                                        "at the call and takes their values as graph inputs",
                                        frame_name(self.code), count)
            return self(*args, **kwargs)
        options = self.ctx.options
        stance = current_stance()
        if cache.entries and stance == "fail_on_recompile":
            raise RuntimeError(f"kiln: {self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno}) "
                               f"would recompile under set_stance('fail_on_recompile'): {failure_text(self._latest_failure(L, G))}")
        if cache.entries and stance == "eager_on_recompile" or stance == "eager_then_compile" and \
                not cache.ran_eagerly:
            cache.ran_eagerly = True
            return self._eager(f"set_stance({stance!r})", args, kwargs, permanent=False)
        if cache.entries:
            failure = self._latest_failure(L, G)
            reason = failure_text(failure)
            key = failure_key(failure, cache.entries[-1].guards)
            cache.failures[key] = cache.failures.get(key, 0) + 1
            if len(cache.entries) >= options.recompile_limit:
                if not cache.limit_warned:
                    cache.limit_warned = True
                    message = self._limit_message(options.recompile_limit, reason)
                    warnings.warn(message, stacklevel=3)
                    log("recompiles").warning("%s", message)
                    if self.ctx.observed:
                        emit(FrameRunEagerly(frame_name(self.code), message))
                return self.fn(*args, **kwargs)
            cache.recompiles += 1
            if failure is not None and options.dynamic is not False:
                cache.note_failed_guard(failure[0], ints=options.dynamic is None)
                for g in cache.entries[-1].guards.changed_floats(L, G):  # every changed float at once
                    cache.note_failed_guard(g, ints=False)
            cache.note_new_modules(cache.entries[-1].guards, L, G)
            if enabled("recompiles"):
                log("recompiles").info("recompiling %s: %s", frame_name(self.code), reason)
            if self.ctx.observed:
                emit(Recompile(frame_name(self.code), reason))
        subclass = _subclass_input(L, self.self_obj)
        if subclass is not None:  # e.g. DTensor parameters/activations of tensor parallelism
            return self._subclass_call(subclass, L, args, kwargs)
        fallback: tuple[str, bool, BaseException | None] | None = None
        # Note: a capture met under a caller's saved-tensor hooks (torch.utils.checkpoint's recording)
        # must not feed them the tensors its own tracing saves: identity hooks sit on top meanwhile.
        with gc_paused(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            entry, fallback = self._compile(L, G, cache, options)
        if fallback is not None:  # outside the except blocks: eager errors carry no capture context
            reason, permanent, error = fallback
            cache.failed_captures += 1
            if not permanent and cache.failed_captures >= _FAILED_CAPTURES_LIMIT:
                # Note: a capture that fails the same frame call after call (a tracing error the next call
                # meets again) would otherwise re-trace on every call: slower than eager by the trace
                reason = (f"capture failed {cache.failed_captures} calls in a row, the frame runs eagerly from "
                          f"now on (kiln.reset() tries again); last: {reason}")
                permanent = True
            out = self._eager(reason, args, kwargs, permanent=permanent)
            if error is not None and not cache.trace_error_warned and not _in_stdlib(self.code):
                cache.trace_error_warned = True
                warnings.warn(_trace_error_message(frame_name(self.code), error), UserWarning, stacklevel=3)
            return out
        cache.failed_captures = 0
        assert entry is not None
        cache.entries.append(entry)
        try:
            return entry.run(L, G)
        except AliasMismatch:  # the capture saw these very inputs: not expected, but never run wrongly
            return self._eager("input tensors alias differently from the capture of this call", args,
                               kwargs, permanent=False)

    def _compile(self, L: dict, G: dict, cache: CodeCache,
                 options: CaptureOptions) -> tuple[CacheEntry | None, tuple[str, bool, BaseException | None] | None]:
        """Capture the frame and compile it: (the new cache entry, None) or (None, (reason, permanent,
        the exception tracing raised or None)) when it runs eagerly instead."""
        assert self.code is not None
        fallback: tuple[str, bool, BaseException | None] | None = None
        t0 = time.perf_counter()
        try:
            try:
                cap = self._capture(L, G, cache, options)
            except Unsupported:
                raise
            except Exception:
                symbolic = cache.dynamic_floats | ({local_source(n) for n, v in L.items() if type(v) is float}
                                                   - cache.static_floats if options.dynamic is True else set())
                if not symbolic:
                    raise
                # Note: a symbolic float met an operation with no graph form (``round(s * 100)``): its
                # sources are constants again (a graph per value, as before they changed)
                if enabled("recompiles"):
                    log("recompiles").info("%s: capture with symbolic floats failed; they are constants again",
                                           ", ".join(sorted(symbolic)))
                cache.static_floats |= symbolic
                cache.dynamic_floats.clear()
                cap = self._capture(L, G, cache, options)
        except Unsupported:
            raise
        except SkipFrame as e:
            fallback = (f"{e}", True, None)
        except GraphBreak as e:
            if options.fullgraph:
                raise Unsupported(f"{e.reason} (hint: {e.hint})") from e
            fallback = (e.reason, False, None)
        except Exception as e:  # a user error during tracing: eager raises it with the real traceback
            if options.fullgraph and not isinstance(e, (TypeError, ValueError, AssertionError, RuntimeError,
                                                        KeyError, IndexError, AttributeError, NameError)):
                raise
            fallback = (f"{type(e).__name__} while tracing: {e}", False, e)
        if fallback is None and cap.break_plan is not None and cap.break_plan.inst.opname not in CAN_RUN:
            fallback = (f"graph break at {cap.break_plan.inst.opname}, which cannot run in Python between "
                        f"graphs: {cap.break_plan.reason}", True, None)
        if self.ctx.observed:
            emit(StageTime("capture", time.perf_counter() - t0, graph=frame_name(self.code)))
        if fallback is not None:
            return None, fallback
        entry = self._make_entry(cap)
        for hook in self.ctx.on_capture:
            hook(cap, cache)
        return entry, None

    def _capture(self, L: dict, G: dict, cache: CodeCache, options: CaptureOptions) -> Capture:
        assert self.code is not None
        symbolic = cache.may_be_dynamic(L, options)
        dims_before = cache.dynamic_dim_count()
        new_modules = frozenset(cache.new_modules)
        cap = run_capture(self.code, G, self.closure, L, options, cache.dynamic_policy(options), symbolic,
                          new_modules)
        if not symbolic and cache.dynamic_dim_count() > dims_before:
            # a tensor reached through an attribute or a nested container changed size (found while
            # tracing): capture again with symbolic sizes instead of compiling one more static graph
            cap = run_capture(self.code, G, self.closure, L, options, cache.dynamic_policy(options), True,
                              new_modules)
        return cap

    def _subclass_call(self, what: str, L: dict, args: tuple, kwargs: dict) -> Any:
        """A frame with tensor-subclass inputs: a torch.nn module's forward over DTensors runs as a
        compiled local program (dtensor_frames.py); anything else runs eagerly, logged."""
        module, code = self.self_obj, self.code
        if "torch.distributed.tensor" not in sys.modules:  # no DTensor exists in this process
            return self._subclass_eager(what, args, kwargs)
        # Note: imported on first use: torch.distributed.tensor costs ~1 s of import time, which every
        # process that never meets a DTensor would pay at `import kiln`.
        dtensor_frames = importlib.import_module(".dtensor_frames", __package__)
        if not isinstance(module, nn.Module) or code is None or self.func is None \
                or not (dtensor_frames.leaf_module(module) and dtensor_frames.only_dtensors(L, module)):
            return self._subclass_eager(what, args, kwargs)
        try:
            key = (code, dtensor_frames.frame_key(module, args, kwargs))
        except dtensor_frames.NotRecordable as e:
            return self._subclass_eager(f"{what}; {e}", args, kwargs)
        prog = self.ctx.dtensor_programs.get(key)
        if prog is None:
            t0 = time.perf_counter()
            try:
                prog = dtensor_frames.build_program(module, functools.partial(self.func, module), args, kwargs,
                                                    self.ctx.backend)
            except dtensor_frames.NotRecordable as e:
                prog = f"{what}; {e}"
            except Exception as e:  # noqa: BLE001 - recording or compiling failed: eager says what the user did wrong
                prog = f"{what}; recording its local program failed ({type(e).__name__}: {e})"
            self.ctx.dtensor_programs[key] = prog
            if self.ctx.observed:
                emit(StageTime("capture", time.perf_counter() - t0, graph=frame_name(code)))
            if isinstance(prog, dtensor_frames.LocalProgram):
                log("distributed").info("%s over DTensors compiled as a local program: %d local ops "
                                        "(%d collectives) forward and backward, %.2f s",
                                        frame_name(code), prog.op_count, prog.collectives,
                                        time.perf_counter() - t0)
        if isinstance(prog, str):
            return self._subclass_eager(prog, args, kwargs)
        return dtensor_frames.run_program(prog, module, args, kwargs)

    def _subclass_eager(self, what: str, args: tuple, kwargs: dict) -> Any:
        """A frame whose inputs are tensor subclasses runs eagerly (this call; logged once per frame):
        kiln traces plain tensors, so the graph breaks cleanly at the subclass boundary."""
        assert self.code is not None
        if self.code not in self.ctx.subclass_logged:
            self.ctx.subclass_logged.add(self.code)
            reason = f"its inputs are tensor subclasses: {what}"
            log("graph_breaks").info("running %s eagerly while %s", frame_name(self.code), reason)
            if self.ctx.observed:
                emit(FrameRunEagerly(frame_name(self.code), reason))
        return self.fn(*args, **kwargs)

    def _latest_failure(self, L: dict, G: dict) -> tuple[Guard, str] | None:
        """The first failing guard of the newest entry (the most general one: automatic dynamic
        shapes make each recompile serve more sizes), with the value seen."""
        assert self.cache is not None
        for entry in reversed(self.cache.entries):
            failure = entry.guards.first_failure(L, G)
            if failure is not None:
                return failure
            aliased = entry.capture.aliasing.failure(L, G) if entry.capture is not None and \
                entry.capture.aliasing is not None else None
            if aliased is not None:
                return Guard("", "GLOBAL_STATE", ALIASING), aliased
            changed = entry.layouts.failure() if entry.layouts is not None else None
            if changed is not None:  # a parameter or buffer relaid out in place (pinned_layouts.py)
                source, expected, actual = changed
                return Guard(source, "TENSOR_MATCH", expected, RELAID_OUT), repr(actual)
        return None

    def _limit_message(self, limit: int, reason: str) -> str:
        """The recompile-limit warning: which guard kept failing and what to do about it."""
        assert self.code is not None and self.cache is not None
        kept, times = max(self.cache.failures.items(), key=lambda kv: kv[1])
        return (f"kiln.capture: {self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno}) "
                f"hit the recompile limit ({limit}); it runs EAGERLY (not compiled) from now on. The guard "
                f"that kept failing ({times} of {sum(self.cache.failures.values())} misses): {kept}. Last: "
                f"{reason}. If a size varies, mark it dynamic (kiln.mark_dynamic(t, dim), or "
                "kiln.compile(..., dynamic=True)); if a Python value varies, pass it as an argument or a "
                "tensor; or raise the limit (recompile_limit / KILN_RECOMPILE_LIMIT)")

    def _eager(self, reason: str, args: tuple, kwargs: dict, permanent: bool) -> Any:
        assert self.code is not None and self.cache is not None
        log("graph_breaks").info("running %s eagerly: %s", frame_name(self.code), reason)
        if self.ctx.observed:
            emit(FrameRunEagerly(frame_name(self.code), reason))
        for hook in self.ctx.on_eager:
            hook(frame_name(self.code), reason)
        if permanent:
            self.cache.eager_reason = reason
            self.cache.eager_reported = True  # counted just now
        return self.fn(*args, **kwargs)

    def _make_entry(self, cap: Capture) -> CacheEntry:
        assert self.code is not None
        if self.ctx.observed and needs_backend(cap):
            emit(GraphCaptured(frame_name(self.code), cap.captured))
        compiled = compile_capture(cap, self.ctx.backend, self.code)
        identity = {g.source for g in cap.captured.guards if g.kind == "ID_MATCH"}
        extract = extractor(cap.input_sources, cap.example_inputs, identity)
        if cap.aliasing is not None:  # tensor arguments passed twice, or written (aliasing.py)
            extract = cap.aliasing.checking(extract, cap.input_sources)
        layouts = pinned_layouts(cap.pinned_tensors)
        check = _entry_check(cap, layouts)
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
        return CacheEntry(cap.captured.guards, check, run, cap, compiled, layouts=layouts)

    def _break_runner(self, bp: BreakPlan, compiled: Any, extract: Callable, effects: list) -> Callable:
        assert self.code is not None
        code, ctx, f_globals = self.code, self.ctx, self.f_globals
        log("graph_breaks").info("graph break in %s: %s\n  at %s", code.co_name, bp.reason,
                                 "\n  from ".join(bp.user_stack))
        if ctx.observed:
            emit(GraphBreakEvent(frame_name(code), bp.reason, tuple(bp.user_stack)))
        names = tuple(bp.local_names)

        def run(L: dict, G: dict) -> Any:
            outs = compiled(*extract(L, G)) if compiled is not None else ()
            pending = _effect_values(effects, outs, L, G) if effects else ()
            if pending and any(e[1] == EXIT_CALL for e in pending):
                _apply([e for e in pending if e[1] == EXIT_CALL])
                pending = [e for e in pending if e[1] != EXIT_CALL]
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




def _entry_check(cap: Capture, layouts: PinnedLayouts | None) -> Callable[[dict, dict], bool]:
    """The entry's guards, then what guards as data do not cover: the traced module calls (hooks,
    forwards; module_calls.py) and the layouts of the tensors pinned by identity."""
    guards_hold = cap.captured.guards.compile()
    calls_same = call_path_check(cap.call_paths, cap.global_hooks) if cap.global_hooks is not None else None
    if layouts is not None:  # PinnedLayouts.same() inlined: one int comparison while nothing changed
        epoch, seen, recheck = EPOCH, layouts.seen, layouts.recheck
    if calls_same is not None and layouts is not None:
        def check(L: dict, G: dict) -> bool:
            return guards_hold(L, G) and (epoch[0] == seen[0] or recheck()) and calls_same()
    elif calls_same is not None:
        def check(L: dict, G: dict) -> bool:
            return guards_hold(L, G) and calls_same()
    elif layouts is not None:
        def check(L: dict, G: dict) -> bool:
            return guards_hold(L, G) and (epoch[0] == seen[0] or recheck())
    else:
        return guards_hold
    if hasattr(guards_hold, "__kiln_source__"):  # the generated guard code, for inspection
        check.__kiln_source__ = guards_hold.__kiln_source__  # type: ignore[attr-defined]
    return check


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
_FAILED_CAPTURES_LIMIT = 3  # failed captures in a row before a frame runs eagerly for good


def _same(t: Any) -> Any:
    return t


def _checkpoint_compiled(ctx: CompileContext, function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` met at a graph break: it runs in Python (its saved-tensor
    hooks and recomputation), calling ``function`` compiled; the recomputation hits the same entry.

    Note: eager's non-reentrant recompute stops once every saved tensor is back (``early_stop``), after
    the op that saved the last one ran, its in-place writes included (a BatchNorm's running statistics
    are updated again). A compiled graph saves all its tensors at once, before its writes to inputs are
    applied, so stopping there would drop those writes: the recompute runs to the end."""
    if kwargs.get("use_reentrant") is False:
        kwargs = {**kwargs, "early_stop": False}
    return _CHECKPOINT(ctx.wrap_callee(function), *args, **kwargs)


_DELETE = object()  # an attribute deletion (it has no value plan)


def _effect_values(effects: list, outs: Any, L: dict, G: dict) -> list:
    """Everything the side effects will write, computed before any is applied (and before the
    frame's own values are rebuilt) so no plan reads state a replay already changed."""
    return [(obj_plan(outs, L, G), name, _DELETE if value_plan is None else value_plan(outs, L, G))
            for obj_plan, name, value_plan in effects]


def _apply(pending: list) -> None:
    for obj, name, value in pending:
        if name in (CALL, EXIT_CALL):  # a call replayed after the graph (deferred.py)
            obj(*value[0], **value[1])
        elif name == CONTENTS:  # an input list/dict changed in place by the traced code
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


def _star_names(code: types.CodeType, func: Any) -> tuple[str, str] | None:
    """(varargs name, varkw name) of ``def f(a, b, *args, **kwargs)`` without defaults or keyword-only
    parameters, whose binding is positional names, the rest of the arguments, a copy of the keywords
    (what ``inspect.Signature.bind`` gives, ~10 us less per call); None for any other signature."""
    flags = code.co_flags
    if not (flags & inspect.CO_VARARGS and flags & inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount \
            or code.co_posonlyargcount or getattr(func, "__defaults__", None):
        return None
    n = code.co_argcount
    return code.co_varnames[n], code.co_varnames[n + 1]


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
        if cache is not None and cache.eager_reason is None and opt.disabled is None and \
                current_stance() != "force_eager" and active_mode_reason() is None:
            L = bind(args, kwargs)
            for entry in reversed(cache.entries):  # newest first: the most general (see miss())
                try:
                    ok = entry.check(L, G)
                except Exception:
                    ok = False
                if ok:
                    try:
                        out = entry.run(L, G)
                    except AliasMismatch:  # raised before the graph ran: another entry, or a new one
                        continue
                    entry.hits += 1
                    return out
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
            cache.failures.clear()
            cache.dynamic_ints.clear()
            cache.dynamic_floats.clear()
            cache.static_floats.clear()
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


def mark_dynamic(t: torch.Tensor, dim: int | list[int], *, min: int | None = None,  # noqa: A002
                 max: int | None = None) -> None:  # noqa: A002
    """Make ``dim`` of ``t`` symbolic from the first capture on; ``min``/``max`` bound the sizes the
    compiled code serves (guards: a size outside them recompiles, or fails a loaded artifact's check)."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise IndexError(f"mark_dynamic: dim {d} is out of range for a tensor of {t.dim()} dims")
    if min is not None and max is not None and min > max:
        raise ValueError(f"mark_dynamic: min={min} is larger than max={max}")
    dims = [d % t.dim() for d in dims]
    marked = set(getattr(t, "_kiln_dynamic_dims", ()))
    marked.update(dims)
    t._kiln_dynamic_dims = marked  # type: ignore[attr-defined]
    if min is not None or max is not None:
        ranges = dict(getattr(t, "_kiln_dynamic_ranges", {}))
        ranges.update({d: (min, max) for d in dims})
        t._kiln_dynamic_ranges = ranges  # type: ignore[attr-defined]


__all__ = ["GuardSet", "optimize", "reset", "cache_entries", "mark_dynamic"]


def _trace_error_message(frame: str, error: BaseException) -> str:
    """The warning for a frame whose tracing raised where eager did not: kiln could not trace it, so it
    ran uncompiled (a user error would have been raised again by eager)."""
    where = ""
    tb = error.__traceback__
    while tb is not None:
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return (f"kiln.capture: tracing {frame} raised {type(error).__name__}: {error} (at {where}), where eager "
            f"ran without error: the frame runs EAGERLY (not compiled), for good after {_FAILED_CAPTURES_LIMIT} "
            "such calls in a row. This is a limitation of kiln's tracer; please report it (KILN_LOGS=graph_breaks "
            "logs every such fallback)")


_STDLIB = sysconfig.get_paths()["stdlib"]


def _in_stdlib(code: types.CodeType) -> bool:
    """A frame of Python's own library (``copy.deepcopy``'s helpers, reached from a graph break): its
    tracing errors are logged, not warned about (nothing in it is the user's to change)."""
    return code.co_filename.startswith(_STDLIB)
